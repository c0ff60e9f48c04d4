"""Boxes around masks, box NMS and the crop-frame bookkeeping, in NumPy.

Boxes are ``XYXY`` integer pixels unless said otherwise: ``x1, y1`` the first and ``x2, y2`` the
last row/column the mask covers (SAM's convention: a one-pixel mask at (5, 7) is
``[5, 7, 5, 7]``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def batched_mask_to_box(masks: np.ndarray) -> np.ndarray:
    """``(..., H, W)`` boolean masks → ``(..., 4)`` int64 ``XYXY`` boxes; ``[0, 0, 0, 0]`` for an
    empty mask."""
    masks = np.asarray(masks, dtype=bool)
    if masks.size == 0:
        return np.zeros(masks.shape[:-2] + (4,), dtype=np.int64)
    h, w = masks.shape[-2:]
    rows = masks.any(axis=-1)  # (..., H)
    cols = masks.any(axis=-2)  # (..., W)
    top = np.where(rows.any(-1), rows.argmax(-1), 0)
    bottom = np.where(rows.any(-1), h - 1 - rows[..., ::-1].argmax(-1), 0)
    left = np.where(cols.any(-1), cols.argmax(-1), 0)
    right = np.where(cols.any(-1), w - 1 - cols[..., ::-1].argmax(-1), 0)
    return np.stack([left, top, right, bottom], axis=-1).astype(np.int64)


def box_xyxy_to_xywh(box: np.ndarray) -> np.ndarray:
    """``[x1, y1, x2, y2]`` → ``[x1, y1, x2 - x1, y2 - y1]`` (COCO's XYWH) on the last axis."""
    box = np.array(box, copy=True)
    box[..., 2] = box[..., 2] - box[..., 0]
    box[..., 3] = box[..., 3] - box[..., 1]
    return box


def box_area(boxes: np.ndarray) -> np.ndarray:
    """``(N, 4)`` XYXY → ``(N,)`` ``(x2 - x1) * (y2 - y1)`` (torchvision's ``box_area``)."""
    boxes = np.asarray(boxes)
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Greedy non-maximum suppression: indices of the kept boxes, highest score first.

    Boxes ``(N, 4)`` XYXY and ``scores (N,)`` are compared in float32 like torchvision's CPU
    kernel: a box is dropped when its IoU with a kept, higher-scored box is ``> iou_threshold``;
    equal scores keep their input order (stable sort).
    """
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    scores = np.asarray(scores, dtype=np.float32).reshape(-1)
    if len(boxes) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(-scores, kind="stable")
    x1, y1, x2, y2 = (boxes[order, i] for i in range(4))
    areas = (x2 - x1) * (y2 - y1)
    suppressed = np.zeros(len(order), dtype=bool)
    keep = []
    threshold = np.float32(iou_threshold)
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(order[i])
        rest = slice(i + 1, None)
        w = np.maximum(np.float32(0), np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]))
        h = np.maximum(np.float32(0), np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]))
        inter = w * h
        iou = inter / (areas[i] + areas[rest] - inter)
        suppressed[rest] |= iou > threshold
    return np.asarray(keep, dtype=np.int64)


def is_box_near_crop_edge(boxes: np.ndarray, crop_box: Sequence[int], orig_box: Sequence[int],
                          atol: float = 20.0) -> np.ndarray:
    """``(N,)`` True where a crop-frame box lies within ``atol`` px of an edge of the crop that
    is not also an edge of the original image (the mask is probably cut off by the crop)."""
    boxes = uncrop_boxes_xyxy(boxes, crop_box).astype(np.float32)
    crop = np.asarray(crop_box, dtype=np.float32)[None]
    orig = np.asarray(orig_box, dtype=np.float32)[None]
    near_crop_edge = np.abs(boxes - crop) <= atol
    near_image_edge = np.abs(boxes - orig) <= atol
    return np.any(near_crop_edge & ~near_image_edge, axis=1)


def uncrop_boxes_xyxy(boxes: np.ndarray, crop_box: Sequence[int]) -> np.ndarray:
    """Boxes in a crop's frame → the original image's frame."""
    x0, y0 = crop_box[:2]
    return np.asarray(boxes) + np.array([x0, y0, x0, y0])


def uncrop_points(points: np.ndarray, crop_box: Sequence[int]) -> np.ndarray:
    """``(..., 2)`` points ``(x, y)`` in a crop's frame → the original image's frame."""
    x0, y0 = crop_box[:2]
    return np.asarray(points) + np.array([x0, y0])


def uncrop_masks(masks: np.ndarray, crop_box: Sequence[int], orig_h: int,
                 orig_w: int) -> np.ndarray:
    """``(N, h, w)`` masks of a crop → ``(N, orig_h, orig_w)``, zero outside the crop."""
    x0, y0, x1, y1 = crop_box
    if x0 == 0 and y0 == 0 and x1 == orig_w and y1 == orig_h:
        return masks
    pad_x, pad_y = orig_w - (x1 - x0), orig_h - (y1 - y0)
    return np.pad(masks, [(0, 0), (y0, pad_y - y0), (x0, pad_x - x0)])
