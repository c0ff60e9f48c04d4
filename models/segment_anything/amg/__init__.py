"""Building blocks of automatic mask generation (SAM's ``utils/amg.py``), on NumPy / MLX:
point grids and crops, run-length encodings, mask boxes and box NMS, stability scores and the
small-region clean-up. ``SamAutomaticMaskGenerator`` (``automatic_mask_generator.py``) puts them
together."""

from .boxes import (batched_mask_to_box, box_area, box_xyxy_to_xywh, is_box_near_crop_edge, nms,
                    uncrop_boxes_xyxy, uncrop_masks, uncrop_points)
from .crops import (batch_iterator, build_all_layer_point_grids, build_point_grid,
                    generate_crop_boxes)
from .mask_data import MaskData
from .masks import calculate_stability_score, remove_small_regions
from .rle import area_from_rle, coco_encode_rle, mask_to_rle, rle_to_mask

__all__ = [
    "MaskData", "area_from_rle", "batch_iterator", "batched_mask_to_box", "box_area",
    "box_xyxy_to_xywh", "build_all_layer_point_grids", "build_point_grid",
    "calculate_stability_score", "coco_encode_rle", "generate_crop_boxes",
    "is_box_near_crop_edge", "mask_to_rle", "nms", "remove_small_regions", "rle_to_mask",
    "uncrop_boxes_xyxy", "uncrop_masks", "uncrop_points",
]
