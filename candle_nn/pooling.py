"""Max and average pooling on NHWC tensors (stateless; they run on their caller's stream).

The work is MLX's own ``mlx.nn.MaxPool2d`` / ``AvgPool2d`` (max pooling is the op
``candle_nn.ops.max_pool2d``, with a CUDA kernel registered). What this module adds: candle-style
functions and :class:`~candle_nn.module.Module` layers bound to a device.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from . import ops
from .device import Device
from .errors import ConfigError, ShapeMismatchError
from .inputs import check_layer_input
from .module import Module
from .ops.pooling import mlx_pool as _mlx_pool
from .pairs import pair


def _args(x: mx.array, layer: str, kernel_size, stride,
          padding) -> tuple[tuple[int, int], ...]:
    """``(kernel, stride, padding)`` as pairs, after checking ``x`` and that the window fits the
    padded input (one message on every path)."""
    kernel = pair(kernel_size)
    stride, padding = pair(stride if stride is not None else kernel), pair(padding)
    check_layer_input(x, layer, spatial=True, channels=None)
    for side, size, k, p in (("height", x.shape[1], kernel[0], padding[0]),
                             ("width", x.shape[2], kernel[1], padding[1])):
        if 2 * p > k:
            raise ConfigError(f"{layer}: padding {padding} is more than half the {kernel[0]}x"
                              f"{kernel[1]} window (PyTorch's limit); pass at most k // 2")
        if size + 2 * p < k:
            raise ShapeMismatchError(
                f"{layer}: a {kernel[0]}x{kernel[1]} window (padding {padding}) does not fit the "
                f"{x.shape[2]}x{x.shape[1]} input {tuple(x.shape)} ({side} {size}): pass a larger "
                "image or a smaller window")
    return kernel, stride, padding


def max_pool2d(x: mx.array, kernel_size: int | tuple[int, int],
               stride: int | tuple[int, int] | None = None,
               padding: int | tuple[int, int] = 0) -> mx.array:
    """Max pooling (padding counts as -inf, as PyTorch). ``(N, H, W, C)`` → ``(N, H', W', C)``
    with ``H' = (H + 2 * pad_h - k_h) // stride_h + 1`` (likewise ``W'``); ``stride`` defaults to
    ``kernel_size``."""
    return ops.max_pool2d(x, *_args(x, "max_pool2d", kernel_size, stride, padding))


def avg_pool2d(x: mx.array, kernel_size: int | tuple[int, int],
               stride: int | tuple[int, int] | None = None,
               padding: int | tuple[int, int] = 0) -> mx.array:
    """Average pooling; zero padding is counted (PyTorch's ``count_include_pad=True``). Shapes as
    :func:`max_pool2d`."""
    return _mlx_pool(nn.AvgPool2d, *_args(x, "avg_pool2d", kernel_size, stride, padding))(x)


class _Pool2d(Module):
    """Shared constructor of the pooling modules. ``stride`` defaults to ``kernel_size``."""

    def __init__(self, kernel_size: int | tuple[int, int],
                 stride: int | tuple[int, int] | None = None,
                 padding: int | tuple[int, int] = 0, *, device: Device | None = None) -> None:
        super().__init__(device)
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding


class MaxPool2d(_Pool2d):
    """:func:`max_pool2d` as a module: ``(N, H, W, C)`` → ``(N, H', W', C)``. ``stride``
    defaults to ``kernel_size``."""

    def forward(self, x: mx.array) -> mx.array:
        _args(x, "MaxPool2d", self.kernel_size, self.stride, self.padding)
        return max_pool2d(x, self.kernel_size, self.stride, self.padding)


# Siblings, not parent and child: ``isinstance(avg_pool, MaxPool2d)`` must be False.
class AvgPool2d(_Pool2d):
    """:func:`avg_pool2d` as a module: ``(N, H, W, C)`` → ``(N, H', W', C)``. ``stride``
    defaults to ``kernel_size``."""

    def forward(self, x: mx.array) -> mx.array:
        _args(x, "AvgPool2d", self.kernel_size, self.stride, self.padding)
        return avg_pool2d(x, self.kernel_size, self.stride, self.padding)
