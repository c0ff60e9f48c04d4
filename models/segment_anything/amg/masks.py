"""Mask quality and clean-up: SAM's stability score and the removal of small islands / holes."""

from __future__ import annotations

from candle_nn import ops
import mlx.core as mx
import numpy as np


def calculate_stability_score(masks: mx.array, mask_threshold: float,
                              threshold_offset: float) -> mx.array:
    """IoU of the masks thresholded at ``mask_threshold ± threshold_offset``.

    ``masks``: ``(N, H, W)`` logits → ``(N,)`` float32. The high-threshold mask lies inside the
    low-threshold one, so the IoU is the ratio of their pixel counts.
    """
    return ops.stability_score(masks, mask_threshold, threshold_offset)


# 8-connectivity, as SAM's cv2.connectedComponentsWithStats(mask, 8).
_EIGHT_CONNECTED = np.ones((3, 3), dtype=bool)


def remove_small_regions(mask: np.ndarray, area_thresh: float,
                         mode: str) -> tuple[np.ndarray, bool]:
    """Fill holes (``mode="holes"``) or drop islands (``mode="islands"``) smaller than
    ``area_thresh`` pixels in an ``(H, W)`` boolean mask; returns ``(mask, changed)``.

    Islands: when every island is small, the largest one is kept. Connected components come from
    SciPy's ``ndimage.label`` (8-connected).
    """
    from scipy import ndimage

    if mode not in ("holes", "islands"):
        raise ValueError(f"mode must be 'holes' or 'islands', not {mode!r}")
    correct_holes = mode == "holes"
    working = correct_holes ^ np.asarray(mask, dtype=bool)
    regions, n_regions = ndimage.label(working, structure=_EIGHT_CONNECTED)
    sizes = np.bincount(regions.ravel(), minlength=n_regions + 1)[1:]
    small = [i + 1 for i, s in enumerate(sizes) if s < area_thresh]
    if not small:
        return mask, False
    fill_labels = [0] + small
    if not correct_holes:
        fill_labels = [i for i in range(n_regions + 1) if i not in fill_labels]
        if not fill_labels:  # every island is small: keep the largest
            fill_labels = [int(np.argmax(sizes)) + 1]
    return np.isin(regions, fill_labels), True
