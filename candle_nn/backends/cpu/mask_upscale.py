"""SAM's mask output upscaling by the compiled kernel (csrc/mask_upscale.cpp): one block of a
prompt's image tokens per task, the first transposed conv's factored output, LayerNorm, GELUs,
the second transposed conv (as a Linear) and the hypernetwork product with every intermediate
in per-thread scratch.

MLX limitation: as ops it is five passes over 4-8 MB per prompt of intermediates, each a fresh
buffer faulted in page by page, and a final product whose transposed operand MLX copies first.
"""

from __future__ import annotations

import mlx.core as mx

from ...ops.registry import register
from . import kernels


def _applies(scale, shared, coeff, weight, bias, ln_weight, ln_bias, eps, w2, b2,
             hyper) -> bool:
    arrays = (shared, coeff, weight, bias, ln_weight, ln_bias, w2, b2, hyper)
    return (kernels.float32_cpu(scale.dtype) and all(a.dtype == mx.float32 for a in arrays)
            and scale.ndim == 2 and shared.ndim == 2 and coeff.ndim == 3 and weight.ndim == 3
            and w2.ndim == 2 and hyper.ndim == 3
            and shared.shape[1] % 32 == 0 and w2.shape[0] % 32 == 0)


@register("mask_upscale", "mask_upscale", "cpu", applies=_applies, available=kernels.loaded,
          works_around="passes over fresh multi-MB intermediates; a copied transposed operand")
def mask_upscale(scale, shared, coeff, weight, bias, ln_weight, ln_bias, eps, w2, b2, hyper):
    kernels.sync_threads()
    return kernels.module().mask_upscale(scale, shared, coeff, weight, bias, ln_weight, ln_bias,
                                         eps, w2, b2, hyper)
