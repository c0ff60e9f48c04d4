"""Attention between a few prompt tokens and many image tokens, each prompt with its own copy of
the image tokens (SAM's automatic masks: ``b`` point prompts, ``n = 4096`` image tokens of ``c``
channels each, ``r = heads * t`` folded token rows per prompt).

Both ops add to the scores a per-head positional share ``pe[h] @ q[h]ᵀ``: ``pe (heads, n, d)``
(per image), ``q (heads, b t, d)`` (per prompt, rows ``p t .. p t + t - 1`` of prompt ``p``);
row ``h * t + u`` of prompt ``p``'s scores gets ``pe[h] @ q[h, p t + u]``.
"""

from __future__ import annotations

import mlx.core as mx

from .registry import op


def _positional(pe: mx.array, q: mx.array, b: int) -> mx.array:
    """The positional share ``(b, n, heads, t)``."""
    heads, n, _ = pe.shape
    share = (pe @ q.swapaxes(1, 2)).reshape(heads, n, b, -1)
    return share.transpose(2, 1, 0, 3)


@op("point_pool")
def point_pool(folded: mx.array, image: mx.array, pe: mx.array, q: mx.array) -> mx.array:
    """``softmax(folded @ imageᵀ + positional) @ image`` per prompt, the softmax over the ``n``
    image tokens: ``folded (b, r, c)``, ``image (b, n, c)``, ``pe (heads, n, d)``,
    ``q (heads, b t, d)`` with ``r = heads * t`` → ``(b, r, c)``."""
    b, r, _ = folded.shape
    heads, n, _ = pe.shape
    share = (q @ pe.swapaxes(1, 2)).reshape(heads, b, r // heads, n)  # (heads, b, t, n)
    scores = folded @ image.swapaxes(1, 2) + share.transpose(1, 0, 2, 3).reshape(b, r, n)
    return mx.softmax(scores, axis=-1) @ image


@op("point_spread")
def point_spread(x: mx.array, folded: mx.array | None, pe: mx.array, q: mx.array,
                 values: mx.array, weight: mx.array, ln_bias: mx.array, eps: float) -> mx.array:
    """``LayerNorm(x + P @ values)`` with ``P = softmax(x @ foldedᵀ + positional)``, the softmax
    over each head's ``t`` tokens: ``x (1 or b, n, c)`` (one image shared by every prompt, or
    one per prompt), ``folded`` and ``values (b, r, c)`` (``folded=None``: the scores are the
    positional share alone), ``pe (heads, n, d)``, ``q (heads, b t, d)``, LayerNorm
    ``weight``, ``ln_bias (c,)`` → ``(b, n, c)``."""
    b, r, _ = values.shape
    scores = _positional(pe, q, b)  # (b, n, heads, t)
    if folded is not None:
        scores = scores + (x @ folded.swapaxes(1, 2)).reshape(scores.shape)
    probs = mx.softmax(scores, axis=-1).reshape(b, -1, r)
    return mx.fast.layer_norm(mx.addmm(x, probs, values), weight, ln_bias, eps)
