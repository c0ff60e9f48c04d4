"""Scaled dot-product attention through MLX's fused kernel (on the CPU in float32: the same
matmul + softmax + matmul that MLX's CPU fallback runs, with candle_nn's multithreaded softmax)."""

from __future__ import annotations

import math

import mlx.core as mx

from . import cpu_fast


def scaled_dot_product_attention(q: mx.array, k: mx.array, v: mx.array, *,
                                 scale: float | None = None,
                                 mask: mx.array | None = None) -> mx.array:
    """``softmax(q @ k.T * scale + mask) @ v``.

    Shapes: ``q`` ``(B, heads, Lq, D)``, ``k`` ``(B, heads, Lk, D)``, ``v`` ``(B, heads, Lk, Dv)``;
    ``mask`` broadcastable to ``(B, heads, Lq, Lk)`` (an additive float bias or a boolean
    keep-mask).
    ``scale`` defaults to ``1 / sqrt(D)``. Returns ``(B, heads, Lq, Dv)``.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if mask is not None and mask.dtype != mx.bool_:
        mask = mask.astype(q.dtype)
    if cpu_fast.native_applies(q.dtype) and k.dtype == v.dtype == q.dtype \
            and q.shape[1] == k.shape[1]:
        # MLX 0.32's CPU attention is this fallback (fast.cpp), softmax on one thread.
        scores = (q * scale) @ k.swapaxes(-1, -2)
        if mask is not None:
            scores = (mx.where(mask, scores, mx.finfo(scores.dtype).min)
                      if mask.dtype == mx.bool_ else scores + mask)
        return cpu_fast.softmax_last(scores) @ v
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
