"""SAM's mask post-processing by the compiled kernels (csrc/mask_postprocess.cpp):
``resize_masks`` over the non-zero bands of its resize matrices, ``stability_score`` as counts
over the thread pool.

MLX limitation: the resize as dense matmuls is ~150 M multiply-adds per 800x556 mask where its
bands (at most three taps per row for SAM's chain) need ~2 M; the stability score's compare,
cast and sum are three one-thread passes over every full-size mask.
"""

from __future__ import annotations

import mlx.core as mx

from ...ops.registry import register
from . import kernels


def _resize_applies(masks, rows, cols) -> bool:
    return (kernels.float32_cpu(masks.dtype) and rows.dtype == cols.dtype == mx.float32
            and masks.ndim == 3 and rows.ndim == 2 and cols.ndim == 2)


@register("resize_masks", "resize_masks", "cpu", applies=_resize_applies,
          available=kernels.loaded,
          works_around="dense matmuls for banded resize matrices")
def resize_masks(masks, rows, cols):
    kernels.sync_threads()
    return kernels.module().resize_masks(masks, rows, cols)


def _stability_applies(masks, threshold, offset) -> bool:
    return kernels.float32_cpu(masks.dtype) and masks.ndim >= 2


@register("stability_score", "stability_score", "cpu", applies=_stability_applies,
          available=kernels.loaded,
          works_around="compare, cast and sum: one-thread passes over full-size masks")
def stability_score(masks, threshold, offset):
    kernels.sync_threads()
    return kernels.module().stability_score(masks, float(threshold), float(offset))
