"""Normalisation ops."""

from __future__ import annotations

import mlx.core as mx

from .registry import op


def channel_sum(x: mx.array) -> mx.array:
    """Sum over every axis but the last, ``(..., C)`` → ``(C,)``, in float32 to ~1e-6 of the
    values' scale: BatchNorm's batch statistics and their gradient.

    Two levels of ones-vector products (BLAS): the rows, ``M`` of them, cut into ``M / B``
    blocks of ``B ~ sqrt(M)`` rows, summed block by block across the blocks, then over the
    ``B`` partial sums. Rounding error grows with ``B + M / B`` rather than ``M``: one running
    sum per channel (MLX's strided reduction, a single ones-vector product) adds the same
    rounding error at every row of a constant region such as letterbox padding, 2e-4 of a
    channel mean of YOLOv8n's second conv on a 320x320 batch of three where one image is mostly
    padding (PyTorch accumulates in float64 there).
    """
    c = x.shape[-1]
    rows = x.reshape(-1, c)
    m = rows.shape[0]
    block = _block_rows(m)
    if block > 1:  # (M / B, B C): each (row in block, channel) summed over the blocks
        rows = (mx.ones((1, m // block), dtype=x.dtype) @ rows.reshape(m // block, block * c))
        rows = rows.reshape(block, c)
    return (mx.ones((1, rows.shape[0]), dtype=x.dtype) @ rows)[0]


def _block_rows(m: int) -> int:
    """The divisor of ``m`` nearest below ``sqrt(m)`` (1 for a prime ``m``: one level)."""
    for b in range(int(m ** 0.5), 1, -1):
        if m % b == 0:
            return b
    return 1


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
