"""Channel concatenation by the compiled kernel (csrc/concat.cpp).

MLX limitation: the CPU ``concatenate`` copies each input into a strided slice of the output
with its general N-d copy, on one thread (~6 GB/s: 0.8 ms for YOLOv8n's 160x160 C2f concat of
3 x 16 channels; the copies are ~10 % of YOLOv8n's forward on one thread). Here output rows over
the thread pool, one ``memcpy`` per input and row; the pieces of ``mx.split`` (slices of a
contiguous array's last axis) are read in place. The same bits. Traced calls (``mx.grad``,
``mx.compile``) take the reference (no VJP here).
"""

from __future__ import annotations

import mlx.core as mx

from ...ops.registry import register
from . import kernels


def applies(xs) -> bool:
    """Two or more float32 CPU arrays, equal on every axis but the last."""
    if len(xs) < 2 or not all(isinstance(x, mx.array) and kernels.float32_cpu(x.dtype)
                              and x.ndim >= 1 for x in xs):
        return False
    return all(x.shape[:-1] == xs[0].shape[:-1] for x in xs)


@register("concat_last", "concat", "cpu", applies=applies, available=kernels.loaded,
          works_around="MLX's CPU concatenate is a general strided copy on one thread")
def concat_last(xs):
    module = kernels.module()
    if any(module.is_tracer(x) for x in xs):  # the dispatcher only checks array arguments
        return None
    kernels.sync_threads()
    return module.concat_last(list(xs))
