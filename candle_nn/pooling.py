"""Max and average pooling on NHWC tensors (stateless; they run on their caller's stream).

The work is MLX's own ``mlx.nn.MaxPool2d`` / ``AvgPool2d``, except max pooling on a CUDA GPU, which
takes candle_nn's kernel (``cuda_kernels.max_pool2d``, see that module for why). What this module
adds: candle-style functions and :class:`~candle_nn.module.Module` layers bound to a device.
"""

from __future__ import annotations

import functools

import mlx.core as mx
import mlx.nn as nn

from . import cuda_kernels
from .device import Device
from .module import Module
from .pairs import pair

@functools.lru_cache(maxsize=64)
def _mlx_pool(cls: type, kernel: tuple[int, int], stride: tuple[int, int],
              padding: tuple[int, int]) -> nn.Module:
    """MLX's pooling layer for these arguments; it holds no state, so one serves every call."""
    return cls(kernel, stride, padding)


def _args(kernel_size, stride, padding) -> tuple[tuple[int, int], ...]:
    kernel = pair(kernel_size)
    return kernel, pair(stride if stride is not None else kernel), pair(padding)


def max_pool2d(x: mx.array, kernel_size: int | tuple[int, int],
               stride: int | tuple[int, int] | None = None,
               padding: int | tuple[int, int] = 0) -> mx.array:
    """Max pooling (padding counts as -inf, as PyTorch). ``(N, H, W, C)`` → ``(N, H', W', C)``
    with ``H' = (H + 2 * pad_h - k_h) // stride_h + 1`` (likewise ``W'``); ``stride`` defaults to
    ``kernel_size``."""
    kernel, stride, padding = _args(kernel_size, stride, padding)
    if cuda_kernels.on_cuda("max_pool", x.dtype):
        return cuda_kernels.max_pool2d(x, kernel, stride, padding)
    return _mlx_pool(nn.MaxPool2d, kernel, stride, padding)(x)


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
