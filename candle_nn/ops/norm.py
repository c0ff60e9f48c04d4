"""Normalisation ops."""

from __future__ import annotations

import mlx.core as mx

from .registry import op


@op("layer_norm")
def layer_norm(x: mx.array, weight: mx.array | None, bias: mx.array | None,
               eps: float) -> mx.array:
    """LayerNorm over the last axis: ``x`` ``(..., D)``, ``weight`` and ``bias`` ``(D,)`` or
    ``None``."""
    return mx.fast.layer_norm(x, weight, bias, eps)


@op("batch_norm_train")
def batch_norm_train(x: mx.array, mean: mx.array, var: mx.array, weight: mx.array,
                     bias: mx.array, eps: float) -> mx.array:
    """Train-mode BatchNorm's normalisation ``(x - mean) / sqrt(var + eps) * weight + bias``:
    ``x`` ``(..., C)``, ``mean`` and ``var`` ``(C,)`` its batch statistics (computed from ``x``
    by the caller, so the gradient flows through them too), ``weight``, ``bias`` ``(C,)``."""
    return (x - mean) * mx.rsqrt(var + eps) * weight + bias
