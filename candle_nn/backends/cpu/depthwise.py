"""Depthwise convs (groups = channels, one filter each) on the CPU, two implementations.

MLX limitation: grouped convs run a naive scalar loop on one thread.

- ``depthwise`` (csrc/depthwise.cpp): a direct kernel on 8-channel vectors over the thread pool,
  the bias in the accumulators, the epilogue fused per chunk of pixels (any kernel size, stride,
  padding, dilation);
- ``depthwise_shifted``: where the compiled kernels are not loaded (or switched off), ``kH * kW``
  shifted multiply-adds fused by ``mx.compile`` (2.5-4x faster than MLX's loop; still one thread;
  dilation 1; any dtype). Under ``mx.grad`` both give way to the reference.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from ...ops.activation import bias_act
from ...ops.registry import register
from . import kernels
from .elementwise import ACT, act_code, residual_mode


def _native_applies(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                    activation=None, residual=None, residual_after_activation=False) -> bool:
    return (activation in ACT and x.ndim == 4 and kernels.float32_cpu(x.dtype)
            and weight.dtype == mx.float32 and (bias is None or bias.dtype == mx.float32)
            and (residual is None or residual.dtype == mx.float32))


@register("depthwise_conv2d", "depthwise", "cpu", applies=_native_applies,
          available=kernels.loaded, works_around="grouped convs run a naive loop on one thread")
def depthwise_native(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                     activation=None, residual=None, residual_after_activation=False):
    kernels.sync_threads()
    return kernels.module().depthwise_conv2d(
        x, weight, bias, residual, tuple(stride), tuple(padding), tuple(dilation),
        act_code(activation), residual_mode(residual, residual_after_activation))


@functools.lru_cache(maxsize=None)
def shifted(kh: int, kw: int, stride: tuple[int, int], padding: tuple[int, int]):
    """A depthwise conv as ``kH * kW`` shifted multiply-adds, fused by ``mx.compile``. Returns
    ``f(x (N, H, W, C), weight (C, kH, kW, 1)) -> (N, H', W', C)``."""
    (sh, sw), (ph, pw) = stride, padding

    def depthwise(x: mx.array, weight: mx.array) -> mx.array:
        n, h, w, c = x.shape
        oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        xp = mx.pad(x, [(0, 0), (ph, ph), (pw, pw), (0, 0)]) if ph or pw else x
        y = None
        for i in range(kh):
            for j in range(kw):
                tap = xp[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :]
                y = tap * weight[:, i, j, 0] if y is None else y + tap * weight[:, i, j, 0]
        return y

    return mx.compile(depthwise)


def _shifted_applies(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                     activation=None, residual=None, residual_after_activation=False) -> bool:
    return x.ndim == 4 and tuple(dilation) == (1, 1) and mx.default_device() == mx.cpu


@register("depthwise_conv2d", "depthwise_shifted", "cpu", applies=_shifted_applies,
          works_around="grouped convs run a naive loop on one thread")
def depthwise_shifted(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                      activation=None, residual=None, residual_after_activation=False):
    _, kh, kw, _ = weight.shape
    y = shifted(kh, kw, tuple(stride), tuple(padding))(x, weight)
    return bias_act(y, bias, activation, residual, residual_after_activation)
