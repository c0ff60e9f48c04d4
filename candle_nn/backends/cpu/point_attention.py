"""SAM's automatic-mask attention on factored image tokens by the compiled kernels
(csrc/point_attention.cpp): ``point_pool`` one prompt per task, ``point_probs`` and
``point_norm`` one block of a prompt's image rows per task, products single-threaded on register
tiles, the per-head products, softmax and LayerNorm statistics fused in per-thread scratch.

MLX limitation: a batched matmul of few-row products (56 x 112 x 4096 per prompt) runs as one
threaded sgemm call per prompt, whose threads synchronise several times per call; the per-head
products, the softmax over 7 tokens (MLX's ``exp`` ~14 ns an element on the CPU) and the
transposes between the head and the prompt layouts are further passes over ``(b, n, r)``.
"""

from __future__ import annotations

import mlx.core as mx

from ...ops.registry import register
from . import kernels


def _f32(*arrays) -> bool:
    return all(a is None or a.dtype == mx.float32 for a in arrays)


def _probs_applies(pe, k, t, scale=None, shared=None, coeff=None, fold=None, bias=None) -> bool:
    return (kernels.float32_cpu(pe.dtype) and _f32(k, scale, shared, coeff, fold, bias)
            and pe.ndim == 3 and k.ndim == 3
            and (scale is None) == (shared is None) and (coeff is None) == (fold is None)
            and (bias is None or coeff is not None))


@register("point_probs", "point_probs", "cpu", applies=_probs_applies, available=kernels.loaded,
          works_around="per-head products, a 7-wide softmax and layout transposes as passes")
def point_probs(pe, k, t, scale=None, shared=None, coeff=None, fold=None, bias=None):
    kernels.sync_threads()
    return kernels.module().point_probs(pe, k, t, scale, shared, coeff, fold, bias)


def _norm_applies(probs, sq, lp_shared, lp_tok, lin0, gram, eps, channels, scale=None,
                  coeff=None, lc_shared=None, lc_tok=None) -> bool:
    return (kernels.float32_cpu(probs.dtype)
            and _f32(sq, lp_shared, lp_tok, lin0, gram, scale, coeff, lc_shared, lc_tok)
            and probs.ndim == 3 and gram.ndim == 3
            and (coeff is None) == (lc_shared is None) == (lc_tok is None))


@register("point_norm", "point_norm", "cpu", applies=_norm_applies, available=kernels.loaded,
          works_around="per-head products and quadratic forms as passes over (b, n, m)")
def point_norm(probs, sq, lp_shared, lp_tok, lin0, gram, eps, channels, scale=None,
               coeff=None, lc_shared=None, lc_tok=None):
    kernels.sync_threads()
    return kernels.module().point_norm(probs, sq, lp_shared, lp_tok, lin0, gram, eps,
                                       channels, scale, coeff, lc_shared, lc_tok)


def _pool_applies(scale, coeff, fold, shared_k, pe, q, shared_v) -> bool:
    factored = (scale, coeff, fold, shared_k)
    if any(a is None for a in factored) and not all(a is None for a in factored):
        return False
    return (kernels.float32_cpu(pe.dtype) and _f32(*factored, q, shared_v)
            and shared_v.ndim == 3 and shared_v.shape[2] % 8 == 0
            and (coeff is None or (coeff.ndim == 3 and coeff.shape[2] % 8 == 0)))


@register("point_pool", "point_pool", "cpu", applies=_pool_applies, available=kernels.loaded,
          works_around="few-row batched matmuls: one threaded sgemm call per prompt")
def point_pool(scale, coeff, fold, shared_k, pe, q, shared_v):
    kernels.sync_threads()
    return kernels.module().point_pool(scale, coeff, fold, shared_k, pe, q, shared_v)
