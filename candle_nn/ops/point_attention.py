"""Attention between a few prompt tokens and many image tokens held in factored form (SAM's
automatic masks: ``b`` point prompts, ``n = 4096`` image tokens, ``r = heads * t`` token rows
per prompt).

Each prompt's image tokens are ``scale_i y_i + coeff_i basis + bias``: rows ``y`` shared by every
prompt, ``scale (b, n)``, ``coeff (b, n, m)`` per prompt. The ops take ``y``'s products with the
projections per head (``shared (heads, n, d)``, per image) and the prompts' tokens per head
(``tok (heads, b t, d)``, rows ``p t .. p t + t - 1`` of prompt ``p``): row ``h t + u`` of prompt
``p`` gets the per-head product ``shared[h] @ tok[h, p t + u]`` (:func:`per_head`).
"""

from __future__ import annotations

import mlx.core as mx

from .activation import softmax
from .registry import op


def per_head(shared: mx.array, tok: mx.array, b: int) -> mx.array:
    """``shared (heads, n, d)``, ``tok (heads, b t, d)`` → ``(b, n, heads t)``: per prompt and
    head, ``shared[h] @ tok[h]ᵀ``. One product for every prompt against ``tok``
    block-diagonal (``heads`` times the multiply-adds of the per-head products, without
    transposing their ``(heads, n, b t)`` out)."""
    heads, n, d = shared.shape
    t = tok.shape[1] // b
    blocks = (tok.reshape(heads, b, t, d).transpose(0, 3, 1, 2)[:, :, :, None]
              * mx.eye(heads, dtype=tok.dtype).reshape(heads, 1, 1, heads, 1))
    out = shared.transpose(1, 0, 2).reshape(n, -1) @ blocks.reshape(heads * d, -1)
    return out.reshape(n, b, heads * t).transpose(1, 0, 2)


@op("point_probs")
def point_probs(pe: mx.array, k: mx.array, t: int, scale: mx.array | None = None,
                shared: mx.array | None = None, coeff: mx.array | None = None,
                fold: mx.array | None = None, bias: mx.array | None = None) -> mx.array:
    """Image → tokens attention probabilities of factored image rows: the softmax over each
    head's ``t`` tokens of ``pe · k + scale (shared · k) + coeff @ foldᵀ + bias``.

    Shapes: ``pe``, ``shared (heads, n, d)``, ``k (heads, b t, d)``, ``scale (b, n)``, ``coeff
    (b, n, m)``, ``fold (b, r, m)``, ``bias (b, r)`` → ``(b, n, r)``, ``r = heads t``;
    ``scale`` comes with ``shared``, ``coeff`` with ``fold``."""
    b = k.shape[1] // t
    scores = per_head(pe, k, b)
    if scale is not None:
        scores = scores + scale[..., None] * per_head(shared, k, b)
    if coeff is not None:
        scores = scores + coeff @ fold.swapaxes(1, 2)
        if bias is not None:
            scores = scores + bias[:, None]
    heads, r = pe.shape[0], scores.shape[-1]
    return softmax(scores.reshape(b, -1, heads, r // heads)).reshape(scores.shape)


@op("point_norm")
def point_norm(probs: mx.array, sq: mx.array, lp_shared: mx.array, lp_tok: mx.array,
               lin0: mx.array, gram: mx.array, eps: float, channels: int,
               scale: mx.array | None = None, coeff: mx.array | None = None,
               lc_shared: mx.array | None = None, lc_tok: mx.array | None = None) -> mx.array:
    """A LayerNorm's ``1 / sqrt(var + eps)`` of factored rows, times their coefficients.

    The rows (centred) are ``s z + u B`` with ``u = [coeff, probs, 0...] (b, n, mu)``
    (``mu`` rounded up to 8), ``s = scale`` (or 1): ``var = (s² sq + 2 s lin + u gram uᵀ) /
    channels`` where ``sq = |z|²``, ``gram = B Bᵀ`` and ``lin = z · (u B)`` = ``lin0 + Σ probs
    (lp_shared · lp_tok) + Σ coeff (lc_shared · lc_tok)`` (per-head products).

    Shapes: ``probs (b, n, r)``, ``sq``, ``lin0 (n,)``, ``lp_shared (heads, n, d)``, ``lp_tok
    (heads, b t, d)`` (``r = heads t``), ``gram (b, mu, mu)``, ``scale (b, n)``, ``coeff (b, n,
    m)`` with ``lc_shared (heads', n, d')``, ``lc_tok (heads', b t', d')``, ``m = heads' t'`` →
    ``inv u (b, n, mu)``."""
    b, n, _ = probs.shape
    parts = [probs] if coeff is None else [coeff, probs]
    width = sum(p.shape[-1] for p in parts)
    mu = gram.shape[-1]
    if mu > width:
        parts.append(mx.zeros((b, n, mu - width), dtype=probs.dtype))
    u = mx.concatenate(parts, axis=-1)
    lin = lin0 + (probs * per_head(lp_shared, lp_tok, b)).sum(-1)
    if coeff is not None:
        lin = lin + (coeff * per_head(lc_shared, lc_tok, b)).sum(-1)
    quad = ((u @ gram) * u).sum(-1)
    s = 1.0 if scale is None else scale
    inv = mx.rsqrt((s * s * sq + 2 * s * lin + quad) / channels + eps)
    return inv[..., None] * u


@op("point_pool")
def point_pool(scale: mx.array | None, coeff: mx.array | None, fold: mx.array | None,
               shared_k: mx.array | None, pe: mx.array, q: mx.array,
               shared_v: mx.array) -> mx.array:
    """Tokens → image attention pooling of factored image rows: ``A`` the softmax over the
    ``n`` image tokens of ``scale (shared_k · q) + pe · q + fold @ coeffᵀ`` → ``[A coeff, per
    head (A scale) shared_v[h]]``; with ``scale``, ``coeff``, ``fold``, ``shared_k`` all None
    (image rows the same for every prompt), per head ``A shared_v[h]`` of ``A`` the softmax of
    ``pe · q``.

    Shapes: ``scale (b, n)``, ``coeff (b, n, m)``, ``fold (b, r, m)``, ``shared_k``, ``pe
    (heads, n, d)``, ``q (heads, b t, d)`` (``r = heads t``), ``shared_v (heads, n, dv)`` →
    ``(b, r, m + dv)``; without the factored inputs ``q (heads, rows, d)`` → ``(heads, rows,
    dv)``."""
    if scale is None:
        probs = softmax(q @ pe.swapaxes(1, 2))  # (heads, rows, n): the softmax op's kernels
        return probs @ shared_v
    b, n = scale.shape
    heads = pe.shape[0]
    t = q.shape[1] // b

    def to_prompts(x: mx.array) -> mx.array:  # (heads, b t, n) -> (b, heads t, n)
        return x.reshape(heads, b, t, n).transpose(1, 0, 2, 3).reshape(b, heads * t, n)

    scores = (scale[:, None] * to_prompts(q @ shared_k.swapaxes(1, 2))
              + to_prompts(q @ pe.swapaxes(1, 2)) + fold @ coeff.swapaxes(1, 2))
    probs = mx.softmax(scores, axis=-1, precise=True)  # (b, r, n)
    weighted = (probs * scale[:, None]).reshape(b, heads, t, n).transpose(1, 0, 2, 3)
    pooled = weighted.reshape(heads, b * t, n) @ shared_v  # (heads, b t, dv)
    pooled = pooled.reshape(heads, b, t, -1).transpose(1, 0, 2, 3).reshape(b, heads * t, -1)
    return mx.concatenate([probs @ coeff, pooled], axis=-1)
