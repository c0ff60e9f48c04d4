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
