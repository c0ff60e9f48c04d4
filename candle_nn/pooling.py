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
from .module import Module
from .ops.pooling import mlx_pool as _mlx_pool
from .pairs import pair


def _args(kernel_size, stride, padding) -> tuple[tuple[int, int], ...]:
    kernel = pair(kernel_size)
    return kernel, pair(stride if stride is not None else kernel), pair(padding)


def max_pool2d(x: mx.array, kernel_size: int | tuple[int, int],
               stride: int | tuple[int, int] | None = None,
               padding: int | tuple[int, int] = 0) -> mx.array:
    """Max pooling (padding counts as -inf, as PyTorch). ``(N, H, W, C)`` → ``(N, H', W', C)``
    with ``H' = (H + 2 * pad_h - k_h) // stride_h + 1`` (likewise ``W'``); ``stride`` defaults to
    ``kernel_size``."""
    return ops.max_pool2d(x, *_args(kernel_size, stride, padding))


def avg_pool2d(x: mx.array, kernel_size: int | tuple[int, int],
               stride: int | tuple[int, int] | None = None,
               padding: int | tuple[int, int] = 0) -> mx.array:
    """Average pooling; zero padding is counted (PyTorch's ``count_include_pad=True``). Shapes as
    :func:`max_pool2d`."""
    return _mlx_pool(nn.AvgPool2d, *_args(kernel_size, stride, padding))(x)


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
        return max_pool2d(x, self.kernel_size, self.stride, self.padding)


# Siblings, not parent and child: ``isinstance(avg_pool, MaxPool2d)`` must be False.
class AvgPool2d(_Pool2d):
    """:func:`avg_pool2d` as a module: ``(N, H, W, C)`` → ``(N, H', W', C)``. ``stride``
    defaults to ``kernel_size``."""

    def forward(self, x: mx.array) -> mx.array:
        return avg_pool2d(x, self.kernel_size, self.stride, self.padding)
