"""LayerNorm over the last axis by the compiled kernel (csrc/layer_norm.cpp).

MLX limitation: ``mx.fast.layer_norm`` runs on one thread on the CPU; here rows over the thread
pool (two passes per row: mean, then the centred sum of squares).
"""

from __future__ import annotations

import mlx.core as mx

from ...ops.registry import register
from . import kernels


def _applies(x, weight, bias, eps) -> bool:
    if not kernels.float32_cpu(x.dtype) or x.ndim == 0:
        return False
    return all(p is None or (p.dtype == mx.float32 and p.shape == (x.shape[-1],))
               for p in (weight, bias))


@register("layer_norm", "layer_norm", "cpu", applies=_applies, available=kernels.loaded,
          works_around="mx.fast.layer_norm runs on one thread on the CPU")
def layer_norm(x, weight, bias, eps):
    kernels.sync_threads()
    return kernels.module().layer_norm(x, weight, bias, eps)
