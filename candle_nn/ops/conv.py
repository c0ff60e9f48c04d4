"""Convolution ops on NHWC images with a fused epilogue (bias, residual, activation).

Weights are in MLX's layout ``(O, kH, kW, I / groups)``.
"""

from __future__ import annotations

import mlx.core as mx

from .activation import bias_act
from .registry import op


@op("conv2d")
def conv2d(x: mx.array, weight: mx.array, bias: mx.array | None = None,
           stride: tuple[int, int] = (1, 1), padding: tuple[int, int] = (0, 0),
           dilation: tuple[int, int] = (1, 1), groups: int = 1, activation: str | None = None,
           residual: mx.array | None = None, residual_after_activation: bool = False
           ) -> mx.array:
    """``activation(conv2d(x, weight) + bias [+ residual])`` (or with
    ``residual_after_activation``: ``activation(conv2d(x, weight) + bias) + residual``).

    ``x`` ``(N, H, W, C)``, ``weight`` ``(O, kH, kW, C / groups)``, ``bias`` ``(O,)``,
    ``residual`` the output's shape ``(N, H', W', O)``; zero padding.
    """
    out, kh, kw, cin = weight.shape
    if (kh, kw) == (1, 1) and groups == 1 and stride == (1, 1) and padding == (0, 0):
        # A pointwise conv is a matmul; MLX's CPU conv runs it 1.5-3.5x slower (same result).
        y = x @ weight.reshape(out, cin).T
    else:
        y = mx.conv2d(x, weight, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return bias_act(y, bias, activation, residual, residual_after_activation)


@op("depthwise_conv2d")
def depthwise_conv2d(x: mx.array, weight: mx.array, bias: mx.array | None = None,
                     stride: tuple[int, int] = (1, 1), padding: tuple[int, int] = (0, 0),
                     dilation: tuple[int, int] = (1, 1), activation: str | None = None,
                     residual: mx.array | None = None, residual_after_activation: bool = False
                     ) -> mx.array:
    """:func:`conv2d` with ``groups = C = O`` (one filter per channel): ``x`` ``(N, H, W, C)``,
    ``weight`` ``(C, kH, kW, 1)``."""
    y = mx.conv2d(x, weight, stride=stride, padding=padding, dilation=dilation,
                  groups=x.shape[-1])
    return bias_act(y, bias, activation, residual, residual_after_activation)


def is_depthwise(x: mx.array, weight: mx.array, groups: int) -> bool:
    """Whether a conv of ``x`` with ``weight`` and ``groups`` is depthwise (groups = C = O > 1)."""
    out, _, _, cin = weight.shape
    return cin == 1 and 1 < groups == out == x.shape[-1] and x.ndim == 4


@op("conv_transpose2d_blocks")
def conv_transpose2d_blocks(x: mx.array, weight: mx.array, bias: mx.array | None = None,
                            activation: str | None = None) -> mx.array:
    """``activation(conv_transpose2d(x, weight) + bias)`` where stride == kernel size (no
    overlapping taps, no padding), in block layout: each input pixel's own ``kH x kW`` block of
    output pixels, one matmul.

    ``x`` ``(N, H, W, I)``, ``weight`` ``(O, kH, kW, I)``, ``bias`` ``(O,)`` →
    ``(N, H, W, kH * kW * O)``, channel ``(i * kW + j) * O + o`` = channel ``o`` of output pixel
    ``(kH y + i, kW x + j)``; :func:`blocks_to_image` puts the pixels in image order.
    """
    out, kh, kw, cin = weight.shape
    n, h, w, _ = x.shape
    y = (x @ weight.transpose(3, 1, 2, 0).reshape(cin, kh * kw * out)).reshape(n, h, w, -1, out)
    return bias_act(y, bias, activation).reshape(n, h, w, kh * kw * out)


def blocks_to_image(y: mx.array, kernel: tuple[int, int]) -> mx.array:
    """:func:`conv_transpose2d_blocks`' block layout ``(N, H, W, kH * kW * O)`` → the image
    ``(N, H * kH, W * kW, O)`` (a depth-to-space view; the copy happens where it is used)."""
    (kh, kw), (n, h, w, c) = kernel, y.shape
    y = y.reshape(n, h, w, kh, kw, c // (kh * kw)).transpose(0, 1, 3, 2, 4, 5)
    return y.reshape(n, h * kh, w * kw, -1)


def dilate(y: mx.array, stride: tuple[int, int]) -> mx.array:
    """``(N, H', W', O)`` with ``stride - 1`` zero rows / columns between its rows / columns:
    ``(N, (H' - 1) sh + 1, (W' - 1) sw + 1, O)`` (a strided window's gradient, placed back)."""
    sh, sw = stride
    if (sh, sw) == (1, 1):
        return y
    n, oh, ow, o = y.shape
    y = mx.pad(y[:, :, None, :, None, :], [(0, 0), (0, 0), (0, sh - 1), (0, 0), (0, sw - 1),
                                           (0, 0)])
    return y.reshape(n, oh * sh, ow * sw, o)[:, :(oh - 1) * sh + 1, :(ow - 1) * sw + 1]
