"""Winograd F(4x4, 3x3) for 3x3 stride-1 convs on the CPU (``candle_nn._cpu_kernels``).

MLX 0.32.4's CPU conv is im2col + one sgemm (cpu_fast's native ``conv2d_fused`` is the same,
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
(dominated by the rest). tests/test_cpu_winograd.py checks 2e-5 per layer against float64.

When: 3x3, stride 1, dilation 1, groups 1, float32 on the CPU (cpu_fast.applies), with at least
``MIN_TILES`` output tiles (N * ceil(H'/4) * ceil(W'/4)) or at most ``MAX_SMALL_WEIGHT`` = C * O.
With few tiles and a wide weight (ResNet-50's 7x7 stage: 4 tiles, 512 x 512) the time is reading
U, 4x the original weight, and im2col wins (1 thread: 2.75 ms vs 4.2 ms at 7x7x512 -> 512;
a tie at 10x10x256 -> 256, 9 tiles; Winograd 0.46x at 12x12x128 -> 128, 9 tiles; 0.72x at
14x14x256 -> 256, 16 tiles). Model-level A/B: ``python -m benchmarks.bench_cpu_paths --settings
native-im2col native``.
"""

from __future__ import annotations

import weakref

import mlx.core as mx

from . import cpu_native

MIN_TILES = 16
MAX_SMALL_WEIGHT = 128 * 128
_enabled = True
_transformed: dict[int, mx.array] = {}  # id(weight) -> U, dropped when the weight is collected


def enabled() -> bool:
    """Whether 3x3 stride-1 convs take the Winograd path where it applies (default: yes)."""
    return _enabled


def set_enabled(flag: bool) -> None:
    """Turn the Winograd path on or off (off: ``conv2d_fused``'s im2col); for A/B benchmarks."""
    global _enabled
    _enabled = bool(flag)


def applies(x_shape: tuple[int, ...], weight_shape: tuple[int, ...],
            stride: tuple[int, int], padding: tuple[int, int]) -> bool:
    """Whether a groups-1 conv of ``x`` ``(N, H, W, C)`` with ``weight`` ``(O, kH, kW, C)`` takes
    the Winograd path (the caller has checked float32, CPU, groups 1, dilation 1)."""
    if not _enabled or len(x_shape) != 4 or tuple(weight_shape[1:3]) != (3, 3) or stride != (1, 1):
        return False
    n, h, w, c = x_shape
    oh, ow = h + 2 * padding[0] - 2, w + 2 * padding[1] - 2
    if oh <= 0 or ow <= 0:
        return False
    return n * -(-oh // 4) * -(-ow // 4) >= MIN_TILES or c * weight_shape[0] <= MAX_SMALL_WEIGHT


def transformed_weights(weight: mx.array) -> mx.array | None:
    """``U = G w G^T`` of ``weight`` ``(O, 3, 3, C)``, computed on first use and cached while
    ``weight`` lives; ``None`` for a traced weight (under ``mx.grad`` and the like)."""
    key = id(weight)
    u = _transformed.get(key)
    if u is None:
        u = cpu_native.module().winograd_weights(weight)
        if u is None:
            return None
        _transformed[key] = u
        weakref.finalize(weight, _transformed.pop, key, None)
    return u


def conv3x3(x: mx.array, weight: mx.array, bias: mx.array | None, padding: tuple[int, int],
            act_code: int, residual: mx.array | None, residual_mode: int) -> mx.array | None:
    """``act(conv2d(x, weight, stride 1, padding) + bias [+ residual])`` by Winograd (the
    epilogue codes of ``_cpu_kernels.conv2d_fused``); ``None`` where the weight is traced."""
    u = transformed_weights(weight)
    if u is None:
        return None
    return cpu_native.module().winograd_conv3x3(x, weight, u, bias, residual, padding, act_code,
                                                residual_mode)
