"""Channel sums that keep float32 accurate whatever the BLAS.

``(..., C)`` → ``(C,)`` sums over hundreds of thousands of values (train-mode BatchNorm's batch
statistics and its gradient's ``sum(dy)``, ``sum(dy x^)``) lose ~1e-6 relative when summed as one
running total per channel, which train-mode BatchNorm carries into every later layer and the
loss. A product with a ones vector was accurate only by chance of the BLAS's kernel: OpenBLAS's
blocked SGEMM sums ``K`` in chunks, but on AVX-512 CPUs (its SkylakeX/Cooperlake kernels, Zen 4)
products under ~1M multiply-adds go to its "small matrix" kernel, one running sum over ``K`` —
10x the error, and the YOLOv8 train-mode fixtures failed on a Zen 4. Here the blocks are
explicit: sums of ``BLOCK`` consecutive rows, then sums of those, with MLX's own reductions,
so the error is bounded by ``~(BLOCK + K / BLOCK) eps`` on every backend, and differentiable.
"""

from __future__ import annotations

import mlx.core as mx

BLOCK = 64  # rows per partial sum; 64 was the most accurate of 64/256 and as fast on 2 cores


def channel_sum(x: mx.array) -> mx.array:
    """Sum over every axis but the last: ``(..., C)`` → ``(C,)``, blocked (see module doc)."""
    rows = x.reshape(-1, x.shape[-1])
    return _blocked_sum(rows)


def channel_mean(x: mx.array) -> mx.array:
    """Mean over every axis but the last: ``(..., C)`` → ``(C,)``."""
    return channel_sum(x) / (x.size // x.shape[-1])


def _blocked_sum(rows: mx.array) -> mx.array:
    """``(K, C)`` → ``(C,)``: the first ``K // BLOCK * BLOCK`` rows in blocks (recursively), the
    rest summed on their own. Slices of the leading rows are views: nothing is copied."""
    k, c = rows.shape
    if k <= BLOCK:
        return rows.sum(axis=0)
    full = k // BLOCK * BLOCK
    total = _blocked_sum(rows[:full].reshape(-1, BLOCK, c).sum(axis=1))
    return total + rows[full:].sum(axis=0) if full < k else total
