"""SAM's mask decoder output upscaling, many prompts at once (automatic mask generation)."""

from __future__ import annotations

import mlx.core as mx

from .activation import gelu
from .linear import linear
from .norm import layer_norm
from .registry import op


@op("mask_upscale")
def mask_upscale(scale: mx.array, shared: mx.array, coeff: mx.array, weight: mx.array,
                 bias: mx.array, ln_weight: mx.array, ln_bias: mx.array, eps: float,
                 w2: mx.array, b2: mx.array, hyper: mx.array) -> mx.array:
    """The masks' logits in block layout, per prompt, from the first transposed conv's output
    (a Linear from each image token to its ``2 x 2`` block of ``c1``) in factored form
    ``x1 = scale shared + coeff @ weight + bias``: LayerNorm over ``c1`` and GELU, a Linear to
    ``2 x 2`` blocks of ``c2`` and GELU (the second transposed conv), then the product with
    each of the prompt's ``m`` hypernetwork vectors.

    Shapes: ``scale (u, n)``, ``shared (n, 4 c1)`` (the same for every prompt), ``coeff (u, n,
    k)``, ``weight (u, k, 4 c1)``, ``bias (4 c1,)``, ``ln_weight``, ``ln_bias (c1,)``, ``w2
    (4 c2, c1)``, ``b2 (4 c2,)``, ``hyper (u, m, c2)`` → ``(u, m, n, 16)``: per image token its
    ``4 x 4`` output pixels, index ``4 (2 a + b) + 2 c + d`` for the first conv's block offset
    ``(a, b)`` and the second's ``(c, d)``.
    """
    u, n = scale.shape
    x = mx.addmm(scale[..., None] * shared + bias, coeff, weight)  # (u, n, 2*2*c1)
    x = gelu(layer_norm(x.reshape(u, n * 4, -1), ln_weight, ln_bias, eps))  # (u, n 2*2, c1)
    x = linear(x, w2, b2, "gelu")  # (u, n 2*2, 2*2*c2)
    x = hyper @ x.reshape(u, n * 16, -1).swapaxes(1, 2)  # (u, m, n 16)
    return x.reshape(u, hyper.shape[1], n, 16)
