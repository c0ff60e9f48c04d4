"""The PAN neck's wiring, shared by YOLOv8's and YOLO11's necks (their blocks differ: C2f or C3k2).

Top-down: upsample p5 ×2, concatenate p4, fuse; upsample that, concatenate p3, fuse → p3'.
Bottom-up: stride-2 down-sample p3', concatenate the top-down p4, fuse → p4'; down-sample p4',
concatenate p5, fuse → p5'. All NHWC; concatenation on the channel axis, upsampling nearest.
"""

from __future__ import annotations

from typing import Callable

import candle_nn as cn
import mlx.core as mx

__all__ = ["Block", "pan_forward", "upsample2"]

Block = Callable[[mx.array], mx.array]


def upsample2(x: mx.array) -> mx.array:
    """Nearest-neighbour ×2: ``(N, H, W, C)`` → ``(N, 2H, 2W, C)``."""
    return cn.upsample_nearest2d(x, 2 * x.shape[1], 2 * x.shape[2])


def _cat(*xs: mx.array) -> mx.array:
    return cn.ops.concat_last(xs)


def pan_forward(p3: mx.array, p4: mx.array, p5: mx.array, *, top4: Block, top3: Block,
                down3: Block, fuse4: Block, down4: Block,
                fuse5: Block) -> tuple[mx.array, mx.array, mx.array]:
    """``(p3, p4, p5)`` (strides 8, 16, 32) → ``(p3', p4', p5')`` of the same sizes.

    ``top4``/``top3`` fuse the top-down concatenations at strides 16 and 8; ``down3``/``down4``
    are the stride-2 convolutions of the bottom-up path and ``fuse4``/``fuse5`` fuse its
    concatenations at strides 16 and 32.
    """
    x4 = top4(_cat(upsample2(p5), p4))
    out3 = top3(_cat(upsample2(x4), p3))
    out4 = fuse4(_cat(down3(out3), x4))
    out5 = fuse5(_cat(down4(out4), p5))
    return out3, out4, out5
