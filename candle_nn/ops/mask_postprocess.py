"""SAM's mask post-processing, many masks at once: the resize chain to the image and the
stability score."""

from __future__ import annotations

import mlx.core as mx

from .registry import op


@op("resize_masks")
def resize_masks(masks: mx.array, rows: mx.array, cols: mx.array) -> mx.array:
    """``rows @ masks @ colsᵀ``: a separable linear resize of ``(k, h, w)`` masks with
    ``rows (H, h)`` and ``cols (W, w)`` (e.g. products of bilinear resize matrices, a few
    non-zeros per row) → ``(k, H, W)``."""
    return rows @ masks @ cols.T


@op("stability_score")
def stability_score(masks: mx.array, threshold: float, offset: float) -> mx.array:
    """SAM's stability score of ``(..., H, W)`` logits → ``(...)`` float32: the pixels above
    ``threshold + offset`` over those above ``threshold - offset`` (the IoU of the two
    thresholded masks: the first lies inside the second)."""
    inter = (masks > (threshold + offset)).astype(mx.int32).sum(axis=(-2, -1))
    union = (masks > (threshold - offset)).astype(mx.int32).sum(axis=(-2, -1))
    return inter.astype(mx.float32) / union.astype(mx.float32)
