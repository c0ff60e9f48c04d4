"""SAM's automatic-mask attention between prompt tokens and per-prompt image tokens by the
compiled kernels (csrc/point_attention.cpp): ``point_pool`` one prompt per task,
``point_spread`` one block of a prompt's image rows per task, products single-threaded on
register tiles, the positional scores, softmax, residual and LayerNorm fused.

MLX limitation: a batched matmul of few-row products (56 x 256 x 4096 per prompt) runs as one
threaded sgemm call per prompt, whose threads synchronise several times per call (one thread per
call is ~3x faster at these shapes), and the softmax and LayerNorm between them are more passes
over the ``(b, n, c)`` image tokens.
"""

from __future__ import annotations

import mlx.core as mx

from ...ops.registry import register
from . import kernels


def _f32(*arrays) -> bool:
    return all(a is None or a.dtype == mx.float32 for a in arrays)


def _pool_applies(folded, image, pe, q) -> bool:
    return (kernels.float32_cpu(folded.dtype) and _f32(image, pe, q) and folded.ndim == 3
            and image.ndim == 3 and image.shape[2] % 8 == 0)


@register("point_pool", "point_pool", "cpu", applies=_pool_applies, available=kernels.loaded,
          works_around="few-row batched matmuls: one threaded sgemm call per prompt")
def point_pool(folded, image, pe, q):
    kernels.sync_threads()
    return kernels.module().point_pool(folded, image, pe, q)


def _spread_applies(x, folded, pe, q, values, weight, ln_bias, eps) -> bool:
    return (kernels.float32_cpu(x.dtype) and _f32(folded, pe, q, values, weight, ln_bias)
            and x.ndim == 3 and x.shape[2] % 8 == 0
            and weight is not None and ln_bias is not None)


@register("point_spread", "point_spread", "cpu", applies=_spread_applies,
          available=kernels.loaded,
          works_around="few-row batched matmuls: one threaded sgemm call per prompt")
def point_spread(x, folded, pe, q, values, weight, ln_bias, eps):
    kernels.sync_threads()
    return kernels.module().point_spread(x, folded, pe, q, values, weight, ln_bias, eps)
