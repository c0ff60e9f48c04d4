"""Max pooling on NHWC tensors."""

from __future__ import annotations

import functools

import mlx.core as mx
import mlx.nn as nn

from .registry import op


@functools.lru_cache(maxsize=64)
def mlx_pool(cls: type, kernel: tuple[int, int], stride: tuple[int, int],
             padding: tuple[int, int]) -> nn.Module:
    """MLX's pooling layer for these arguments; it holds no state, so one serves every call."""
    return cls(kernel, stride, padding)


@op("max_pool2d")
def max_pool2d(x: mx.array, kernel: tuple[int, int], stride: tuple[int, int],
               padding: tuple[int, int]) -> mx.array:
    """Max pooling, padding counting as -inf: ``(N, H, W, C)`` → ``(N, H', W', C)``."""
    return mlx_pool(nn.MaxPool2d, kernel, stride, padding)(x)
