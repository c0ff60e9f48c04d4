"""``x @ W^T + b`` for a few rows (SAM's decoder tokens) by the compiled kernel
(csrc/linear_rows.cpp): dot products over the thread pool, one join.

MLX limitation: a product of a few rows goes to the threaded sgemm, whose threads synchronise
several times per call (a descheduled one stalls it for a time slice on a busy machine).
"""

from __future__ import annotations

import mlx.core as mx

from ...ops.activation import bias_act
from ...ops.registry import register
from . import kernels

MAX_ROWS = 8  # rows up to which the kernel is no slower than the sgemm


def _applies(x, weight, bias=None, activation=None, residual=None) -> bool:
    return (kernels.float32_cpu(x.dtype) and x.ndim > 0 and weight.dtype == mx.float32
            and x.size <= MAX_ROWS * x.shape[-1]
            and (bias is None or bias.dtype == mx.float32))


@register("linear", "linear_rows", "cpu", applies=_applies, available=kernels.loaded,
          works_around="few-row products stall in the threaded sgemm's synchronisation")
def linear_rows(x, weight, bias=None, activation=None, residual=None):
    kernels.sync_threads()
    y = kernels.module().linear_rows(x, weight, bias)
    return bias_act(y, None, activation, residual, residual_after_activation=True)
