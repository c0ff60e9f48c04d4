"""Winograd F(4x4, 3x3) for 3x3 stride-1 convs on the CPU (``candle_nn._cpu_kernels``).

MLX 0.32.4's CPU conv is im2col + one sgemm (the ``im2col`` implementation is the same,
multithreaded): 9 multiply-adds per tap. Winograd F(4x4, 3x3) (Lavin & Gray 2016) computes each
4x4 output tile from a 6x6 input tile with 36 instead of 144 multiplies per channel pair: 36
batched GEMMs ``[tiles x C] . [C x O]`` between an input and an output transform (winograd.cpp).

The weight transform ``U = G w G^T`` ``(36, C, O)`` (C, O rounded up to 8) is computed once per
weight array, in float64, and kept while that array lives (:func:`transformed_weights`).

Accuracy: float32 F(4x4, 3x3) with the points 0, +-1, +-2, infinity is ~8x less accurate than
im2col: max error vs float64 (median / worst of 20 random tiles) 1.6e-6 / 3.8e-6 of the output's
max |value| at C = 16, 1.9e-6 / 4.8e-6 at 64, 4.1e-6 / 1.5e-5 at 256 (im2col 1.6e-7 to 1.3e-6;
F(2x2, 3x3) 2e-7 to 9e-7, but only 2.25x fewer multiplies instead of 4x), well inside the
fixtures' 1e-4 of max |value|: the YOLOv8n/ResNet-18 fixture errors do not change measurably
(dominated by the rest). tests/candle_nn/backends/test_cpu_winograd.py checks 2e-5 per layer
against float64.

When: 3x3, stride 1, dilation 1, groups 1, float32 on the CPU, with at least
``MIN_TILES`` output tiles (N * ceil(H'/4) * ceil(W'/4)) or at most ``MAX_SMALL_WEIGHT`` = C * O.
With few tiles and a wide weight (ResNet-50's 7x7 stage: 4 tiles, 512 x 512) the time is reading
U, 4x the original weight, and im2col wins. One thread, Winograd's time over the packed GEMM's,
weights in cache / from memory (as in a forward): 1.42 / 1.20 at 7x7x512 -> 512; 0.60 / 1.05
at 10x10x256 -> 256, 9 tiles; 0.40 at 12x12x128 -> 128, 9 tiles; 0.53 / 0.80 at 14x14x256 ->
256, 16 tiles. Model-level A/B: ``python -m benchmarks.bench_cpu_paths --settings native-im2col
native``.
"""

from __future__ import annotations

import mlx.core as mx

from ...ops.registry import register
from . import kernels, weight_cache
from .conv_common import conv_applies, with_epilogue

MIN_TILES = 16
MAX_SMALL_WEIGHT = 128 * 128


def applies(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
            activation=None, residual=None, residual_after_activation=False) -> bool:
    """A 3x3 stride-1 conv with enough output tiles, or a small weight (module docstring)."""
    if not conv_applies(x, weight, bias, stride, padding, dilation, groups) \
            or tuple(weight.shape[1:3]) != (3, 3) or tuple(stride) != (1, 1):
        return False
    n, h, w, c = x.shape
    oh, ow = h + 2 * padding[0] - 2, w + 2 * padding[1] - 2
    if oh <= 0 or ow <= 0:
        return False
    return n * -(-oh // 4) * -(-ow // 4) >= MIN_TILES or c * weight.shape[0] <= MAX_SMALL_WEIGHT


def transformed_weights(weight: mx.array) -> mx.array | None:
    """``U = G w G^T`` of ``weight`` ``(O, 3, 3, C)``, computed on first use and cached while
    ``weight`` lives (weight_cache.py)."""
    return weight_cache.derived("winograd", weight, kernels.module().winograd_weights)


def _run(x, weight, bias, stride, padding, act, residual, mode):
    u = transformed_weights(weight)
    if u is None:
        return None
    return kernels.module().winograd_conv3x3(x, weight, u, bias, residual, padding, act, mode)


@register("conv2d", "winograd", "cpu", applies=applies, available=kernels.loaded,
          works_around="the CPU conv is im2col + sgemm: 9 multiply-adds per tap; F(4x4, 3x3) "
                       "needs 2.25")
def conv3x3(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
            activation=None, residual=None, residual_after_activation=False):
    """``act(conv2d(x, weight, stride 1, padding) + bias [+ residual])`` by Winograd."""
    return with_epilogue(_run, x, weight, bias, stride, padding, activation, residual,
                         residual_after_activation)
