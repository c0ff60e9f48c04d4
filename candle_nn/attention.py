"""Scaled dot-product attention through MLX's fused kernel."""

from __future__ import annotations

import math

import mlx.core as mx


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
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
