"""SAM's mask decoder output upscaling, many prompts at once (automatic mask generation)."""

from __future__ import annotations

import mlx.core as mx

from .activation import gelu
from .linear import linear
from .norm import layer_norm
from .registry import op


@op("mask_upscale")
def mask_upscale(keys: mx.array, w1: mx.array, b1: mx.array, ln_weight: mx.array,
                 ln_bias: mx.array, eps: float, w2: mx.array, b2: mx.array,
                 hyper: mx.array) -> mx.array:
    """The masks' logits in block layout from the decoder's image tokens, per prompt: a Linear
    to ``2 x 2`` blocks of ``c1`` (the first transposed conv), LayerNorm over ``c1`` and GELU, a
    Linear to ``2 x 2`` blocks of ``c2`` and GELU (the second), then the product with each of
    the prompt's ``m`` hypernetwork vectors.

    Shapes: ``keys (u, n, c)``, ``w1 (4 c1, c)``, ``b1 (4 c1,)``, ``ln_weight``, ``ln_bias
    (c1,)``, ``w2 (4 c2, c1)``, ``b2 (4 c2,)``, ``hyper (u, m, c2)`` → ``(u, m, n, 16)``: per
    image token its ``4 x 4`` output pixels, index ``4 (2 a + b) + 2 c + d`` for the first
    conv's block offset ``(a, b)`` and the second's ``(c, d)``.
    """
    return upscale_blocks(linear(keys, w1, b1), ln_weight, ln_bias, eps, w2, b2, hyper)


def upscale_blocks(x: mx.array, ln_weight: mx.array, ln_bias: mx.array, eps: float,
                   w2: mx.array, b2: mx.array, hyper: mx.array) -> mx.array:
    """:func:`mask_upscale` from the first Linear's output ``x (u, n, 4 c1)`` on, as MLX ops
    (for callers that have ``x`` in another form, e.g. factored)."""
    u, n, _ = x.shape
    x = gelu(layer_norm(x.reshape(u, n * 4, -1), ln_weight, ln_bias, eps))  # (u, n 2*2, c1)
    x = linear(x, w2, b2, "gelu")  # (u, n 2*2, 2*2*c2)
    x = hyper @ x.reshape(u, n * 16, -1).swapaxes(1, 2)  # (u, m, n 16)
    return x.reshape(u, hyper.shape[1], n, 16)
