"""``SamAutomaticMaskGenerator``: segment a whole image without prompts (MobileSAM's contract).

A grid of single-point prompts covers the image (and, with ``crop_n_layers > 0``, each of a set of
overlapping crops); every point yields SAM's three masks; masks with a low predicted IoU or an
unstable threshold are dropped, duplicates are removed by box NMS within and across crops, masks
cut off by a crop's edge are dropped, and optionally small islands and holes are cleaned up.
The image encoder runs once per crop, and so does the prompt-independent part of the decoder
(:meth:`Sam.point_grid_decoder`); the points go through the rest of the prompt encoder and mask
decoder ``points_per_batch`` at a time, and only the masks that pass the predicted-IoU filter are
upscaled (the decoder's output upscaling, then to the image's size).
"""

from __future__ import annotations

from typing import Any, Callable

from candle_nn import ImageError
from candle_nn.inputs import check_rgb_image
import mlx.core as mx
import numpy as np

from .amg import (MaskData, area_from_rle, batch_iterator, batched_mask_to_box, box_area,
                  box_xyxy_to_xywh, build_all_layer_point_grids, calculate_stability_score,
                  coco_encode_rle, generate_crop_boxes, is_box_near_crop_edge, mask_to_rle, nms,
                  remove_small_regions, rle_to_mask, uncrop_boxes_xyxy, uncrop_masks,
                  uncrop_points)
from .amg.point_decoder import PointGridDecoder
from .predictor import SamPredictor
from .sam import Sam

OUTPUT_MODES = ("binary_mask", "uncompressed_rle", "coco_rle")
POINTS_PER_BATCH = {"cpu": 64, "gpu": 256}  # points_per_batch=None: by the model's device


class SamAutomaticMaskGenerator:
    """Masks for everything in an image, from a grid of point prompts.

    Args (MobileSAM's names and defaults):
        model: a :class:`Sam` (TinyViT or ViT encoder).
        points_per_side: points along each side of the grid (``points_per_side²`` in all);
            ``None`` when ``point_grids`` is given.
        points_per_batch: points decoded together; ``None``: 64 on the CPU (MobileSAM's), 256
            on a GPU (a 64-point decode is ~350 small kernels, which left an H100 idle 40 % of
            its time). The records do not depend on it; memory grows with it.
        pred_iou_thresh: keep masks whose predicted IoU is ``> pred_iou_thresh``.
        stability_score_thresh: keep masks whose stability score is ``>=`` this.
        stability_score_offset: the logit offset of the stability score.
        box_nms_thresh: box-IoU threshold of the NMS within a crop.
        crop_n_layers: extra layers of crops; layer ``i`` has ``(2**i)²`` crops.
        crop_nms_thresh: box-IoU threshold of the NMS across crops (smaller crops win).
        crop_overlap_ratio: overlap of the first layer's crops, as a fraction of the short side.
        crop_n_points_downscale_factor: layer ``i`` uses ``points_per_side / factor**i`` points.
        point_grids: explicit ``(N, 2)`` grids in ``[0, 1]²``, one per layer.
        min_mask_region_area: fill holes / drop islands smaller than this many pixels (0: off).
        output_mode: ``"binary_mask"`` (``(H, W)`` bool arrays), ``"uncompressed_rle"`` or
            ``"coco_rle"`` (pycocotools' compressed, JSON-ready strings).
    """

    def __init__(self, model: Sam, points_per_side: int | None = 32,
                 points_per_batch: int | None = None,
                 pred_iou_thresh: float = 0.88, stability_score_thresh: float = 0.95,
                 stability_score_offset: float = 1.0, box_nms_thresh: float = 0.7,
                 crop_n_layers: int = 0, crop_nms_thresh: float = 0.7,
                 crop_overlap_ratio: float = 512 / 1500, crop_n_points_downscale_factor: int = 1,
                 point_grids: list[np.ndarray] | None = None, min_mask_region_area: int = 0,
                 output_mode: str = "binary_mask") -> None:
        if crop_n_layers < 0:
            raise ValueError(f"crop_n_layers must be >= 0, not {crop_n_layers}")
        if crop_n_points_downscale_factor < 1:
            raise ValueError("crop_n_points_downscale_factor must be >= 1, not "
                             f"{crop_n_points_downscale_factor}")
        if (points_per_side is None) == (point_grids is None):
            raise ValueError("give exactly one of points_per_side and point_grids")
        if points_per_side is not None:
            last = int(points_per_side / crop_n_points_downscale_factor ** crop_n_layers)
            if points_per_side < 1 or last < 1:
                raise ValueError(f"points_per_side={points_per_side} leaves crop layer "
                                 f"{crop_n_layers} {last} points a side: use more points, fewer "
                                 "crop layers or a smaller crop_n_points_downscale_factor")
            self.point_grids = build_all_layer_point_grids(points_per_side, crop_n_layers,
                                                           crop_n_points_downscale_factor)
        else:
            self.point_grids = [np.asarray(g, dtype=np.float64).reshape(-1, 2)
                                 for g in point_grids]
            if len(self.point_grids) != crop_n_layers + 1:
                raise ValueError(f"point_grids has {len(self.point_grids)} grid(s); "
                                 f"crop_n_layers={crop_n_layers} needs {crop_n_layers + 1}")
        if output_mode not in OUTPUT_MODES:
            raise ValueError(f"output_mode must be one of {', '.join(OUTPUT_MODES)}, "
                             f"not {output_mode!r}")
        if points_per_batch is None:
            device = model.device
            points_per_batch = POINTS_PER_BATCH["gpu" if device and device.kind == "gpu" else "cpu"]
        if points_per_batch < 1:
            raise ValueError(f"points_per_batch must be >= 1, not {points_per_batch}")
        self.predictor = SamPredictor(model)
        self.points_per_batch = points_per_batch
        self.pred_iou_thresh = pred_iou_thresh
        self.stability_score_thresh = stability_score_thresh
        self.stability_score_offset = stability_score_offset
        self.box_nms_thresh = box_nms_thresh
        self.crop_n_layers = crop_n_layers
        self.crop_nms_thresh = crop_nms_thresh
        self.crop_overlap_ratio = crop_overlap_ratio
        self.crop_n_points_downscale_factor = crop_n_points_downscale_factor
        self.min_mask_region_area = min_mask_region_area
        self.output_mode = output_mode

    def generate(self, image: np.ndarray,
                 progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
        """Mask records for an ``(H, W, 3)`` uint8 RGB image, best-first within each crop.

        Each record: ``segmentation`` (per ``output_mode``), ``area`` (int pixels), ``bbox``
        (XYWH ints), ``predicted_iou``, ``point_coords`` (``[[x, y]]`` of the prompt, original
        pixels), ``stability_score`` and ``crop_box`` (XYWH of the crop it came from).

        ``progress(done, total)``, when given, is called with the prompt points decoded so far
        and the points in all (every crop's grid): once before the first batch, then after each
        batch. An exception it raises ends the run there (how a caller cancels it).
        """
        image = np.asarray(image)
        image = check_rgb_image(image, where="SamAutomaticMaskGenerator.generate", error=ImageError)
        data = self._generate_masks(image, progress or (lambda done, total: None))
        if self.min_mask_region_area > 0:
            data = self.postprocess_small_regions(data, self.min_mask_region_area,
                                                  max(self.box_nms_thresh, self.crop_nms_thresh))
        if self.output_mode == "coco_rle":
            segmentations = [coco_encode_rle(rle) for rle in data["rles"]]
        elif self.output_mode == "binary_mask":
            segmentations = [rle_to_mask(rle) for rle in data["rles"]]
        else:
            segmentations = data["rles"]
        return [{
            "segmentation": segmentations[i],
            "area": area_from_rle(data["rles"][i]),
            "bbox": box_xyxy_to_xywh(data["boxes"][i]).tolist(),
            "predicted_iou": float(data["iou_preds"][i]),
            "point_coords": [data["points"][i].tolist()],
            "stability_score": float(data["stability_score"][i]),
            "crop_box": box_xyxy_to_xywh(data["crop_boxes"][i]).tolist(),
        } for i in range(len(segmentations))]

    # -- crops -----------------------------------------------------------------------------------
    def _generate_masks(self, image: np.ndarray,
                        progress: Callable[[int, int], None]) -> MaskData:
        orig_size = image.shape[:2]
        crop_boxes, layer_idxs = generate_crop_boxes(orig_size, self.crop_n_layers,
                                                     self.crop_overlap_ratio)
        total = sum(len(self.point_grids[layer]) for layer in layer_idxs)
        done = [0]

        def batch_done(count: int) -> None:
            done[0] += count
            progress(done[0], total)

        progress(0, total)
        data = MaskData()
        for crop_box, layer_idx in zip(crop_boxes, layer_idxs):
            data.cat(self._process_crop(image, crop_box, layer_idx, orig_size, batch_done))
        if len(crop_boxes) > 1 and len(data):
            # Across crops, prefer masks from smaller crops.
            scores = np.float32(1) / box_area(data["crop_boxes"]).astype(np.float32)
            data.filter(nms(data["boxes"], scores, self.crop_nms_thresh))
        return data

    def _process_crop(self, image: np.ndarray, crop_box: list[int], layer_idx: int,
                      orig_size: tuple[int, int],
                      batch_done: Callable[[int], None]) -> MaskData:
        x0, y0, x1, y1 = crop_box
        cropped = image[y0:y1, x0:x1, :]
        crop_size = cropped.shape[:2]
        self.predictor.set_image(cropped)  # the encoder: once per crop
        decoder = self.predictor.model.point_grid_decoder(self.predictor.features)
        points_for_image = self.point_grids[layer_idx] * np.array(crop_size)[None, ::-1]
        data = MaskData()
        for (points,) in batch_iterator(self.points_per_batch, points_for_image):
            data.cat(self._process_batch(decoder, points, crop_size, crop_box, orig_size))
            batch_done(len(points))
        self.predictor.reset_image()
        data.filter(nms(data["boxes"], data["iou_preds"], self.box_nms_thresh))
        data["boxes"] = uncrop_boxes_xyxy(data["boxes"], crop_box)
        data["points"] = uncrop_points(data["points"], crop_box)
        data["crop_boxes"] = np.array([crop_box] * len(data["rles"]), dtype=np.int64).reshape(-1, 4)
        return data

    # -- one batch of points ---------------------------------------------------------------------
    def _process_batch(self, decoder: PointGridDecoder, points: np.ndarray,
                       crop_size: tuple[int, int], crop_box: list[int],
                       orig_size: tuple[int, int]) -> MaskData:
        model, predictor = self.predictor.model, self.predictor
        orig_h, orig_w = orig_size
        coords = predictor.transform.apply_coords(points, crop_size)
        with model.on_device():  # every MLX op on the model's stream
            iou, state = decoder.decode(mx.array(coords, dtype=mx.float32))
            m = iou.shape[-1]
            # Row b*M + k is point b's k-th mask.
            iou_preds = np.array(iou.reshape(-1))
            data = MaskData(iou_preds=iou_preds, points=np.repeat(points, m, axis=0))

            # Upscaling is per mask: only for the masks that pass the predicted-IoU filter.
            keep = np.ones(len(iou_preds), dtype=bool)
            if self.pred_iou_thresh > 0.0:
                keep = iou_preds > self.pred_iou_thresh
                data.filter(keep)
                if not keep.any():
                    return _empty_batch()
            rows = np.flatnonzero(keep)
            low_res = decoder.masks(state, rows // m, rows % m)[..., None]
            masks = model.postprocess_masks(low_res, predictor.input_size, crop_size)[..., 0]

            stability = calculate_stability_score(masks, model.mask_threshold,
                                                  self.stability_score_offset)
            data["stability_score"] = np.array(stability)
            if self.stability_score_thresh > 0.0:
                keep = data["stability_score"] >= self.stability_score_thresh
                data.filter(keep)
                if not keep.any():
                    return _empty_batch()
                masks = masks[mx.array(np.flatnonzero(keep))]
            binary = np.array(masks > model.mask_threshold)
        data["boxes"] = batched_mask_to_box(binary)

        keep = ~is_box_near_crop_edge(data["boxes"], crop_box, [0, 0, orig_w, orig_h])
        if not keep.all():
            data.filter(keep)
            binary = binary[keep]
        data["rles"] = mask_to_rle(uncrop_masks(binary, crop_box, orig_h, orig_w))
        return data

    # -- clean-up ----------------------------------------------------------------------------------
    @staticmethod
    def postprocess_small_regions(data: MaskData, min_area: int, nms_thresh: float) -> MaskData:
        """Fill small holes and drop small islands of every mask, then re-run box NMS,
        preferring masks that needed no change. Edits ``data`` in place."""
        if not len(data):
            return data
        new_masks, scores = [], []
        for rle in data["rles"]:
            mask = rle_to_mask(rle)
            mask, changed_holes = remove_small_regions(mask, min_area, mode="holes")
            mask, changed_islands = remove_small_regions(mask, min_area, mode="islands")
            new_masks.append(mask)
            scores.append(float(not (changed_holes or changed_islands)))
        masks = np.stack(new_masks)
        boxes = batched_mask_to_box(masks)
        keep = nms(boxes, np.array(scores, dtype=np.float32), nms_thresh)
        for i in keep:
            if scores[i] == 0.0:  # only masks that changed get a new RLE and box
                data["rles"][i] = mask_to_rle(masks[i][None])[0]
                data["boxes"][i] = boxes[i]
        data.filter(keep)
        return data


def _empty_batch() -> MaskData:
    return MaskData(iou_preds=np.zeros(0, np.float32), points=np.zeros((0, 2)),
                    stability_score=np.zeros(0, np.float32), boxes=np.zeros((0, 4), np.int64),
                    rles=[])
