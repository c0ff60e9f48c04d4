"""Max and average pooling on NHWC tensors (stateless; they run on their caller's stream)."""

from __future__ import annotations

import mlx.core as mx

from . import cuda_kernels
from .device import Device
from .module import Module
from .pairs import pair


def _windows(x: mx.array, kernel: tuple[int, int], stride: tuple[int, int]) -> mx.array:
    """``(N, H, W, C)`` → ``(N, H', W', kH, kW, C)`` strided view of the pooling windows."""
    n, h, w, c = x.shape
    kh, kw = kernel
    sh, sw = stride
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    x = mx.contiguous(x)
    s = [h * w * c, w * c, c, 1]
    return mx.as_strided(x, (n, oh, ow, kh, kw, c), (s[0], sh * s[1], sw * s[2], s[1], s[2], 1))


def _pool(x: mx.array, kernel, stride, padding, pad_value: float, reduce) -> mx.array:
    kernel = pair(kernel)
    stride = pair(stride if stride is not None else kernel)
    ph, pw = pair(padding)
    if ph or pw:
        x = mx.pad(x, [(0, 0), (ph, ph), (pw, pw), (0, 0)], constant_values=pad_value)
    return reduce(_windows(x, kernel, stride), axis=(3, 4))


def max_pool2d(x: mx.array, kernel_size: "int | tuple[int, int]",
               stride: "int | tuple[int, int] | None" = None,
               padding: "int | tuple[int, int]" = 0) -> mx.array:
    """Max pooling (padding counts as -inf, as PyTorch). ``(N, H, W, C)`` → ``(N, H', W', C)``."""
    if cuda_kernels.on_cuda("max_pool", x.dtype):
        kernel = pair(kernel_size)
        return cuda_kernels.max_pool2d(x, kernel, pair(stride if stride is not None else kernel),
                                       pair(padding))
    return _pool(x, kernel_size, stride, padding, float("-inf"), mx.max)


def avg_pool2d(x: mx.array, kernel_size: "int | tuple[int, int]",
               stride: "int | tuple[int, int] | None" = None,
               padding: "int | tuple[int, int]" = 0) -> mx.array:
    """Average pooling; zero padding is counted (PyTorch's ``count_include_pad=True``)."""
    return _pool(x, kernel_size, stride, padding, 0.0, mx.mean)


class _Pool2d(Module):
    """Shared constructor of the pooling modules. ``stride`` defaults to ``kernel_size``."""

    def __init__(self, kernel_size: "int | tuple[int, int]",
                 stride: "int | tuple[int, int] | None" = None,
                 padding: "int | tuple[int, int]" = 0, *, device: Device | None = None) -> None:
        super().__init__(device)
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding


class MaxPool2d(_Pool2d):
    """:func:`max_pool2d` as a module. ``stride`` defaults to ``kernel_size``."""

    def forward(self, x: mx.array) -> mx.array:
        return max_pool2d(x, self.kernel_size, self.stride, self.padding)


# Siblings, not parent and child: ``isinstance(avg_pool, MaxPool2d)`` must be False.
class AvgPool2d(_Pool2d):
    """:func:`avg_pool2d` as a module. ``stride`` defaults to ``kernel_size``."""

    def forward(self, x: mx.array) -> mx.array:
        return avg_pool2d(x, self.kernel_size, self.stride, self.padding)
