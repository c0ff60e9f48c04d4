"""YOLOv8's distribution-focal-loss decoding."""

from __future__ import annotations

import mlx.core as mx

from .activation import softmax
from .conv import conv2d
from .registry import op


@op("dfl_decode")
def dfl_decode(x: mx.array, weight: mx.array) -> mx.array:
    """``x`` ``(N, A, 4, bins)`` logits, ``weight`` ``(1, 1, 1, bins)`` (a 1x1 conv ``bins -> 1``
    in MLX's layout) → ``(N, A, 4)``: the softmax over the bins dotted with the weights."""
    # (N, A, 4, bins) is an NHWC "image" of A x 4 pixels: the 1x1 conv contracts the bins.
    return conv2d(softmax(x, axis=-1), weight).reshape(x.shape[:-1])
