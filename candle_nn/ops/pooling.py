"""Max pooling on NHWC tensors, with PyTorch's gradient.

The forward is MLX's ``nn.MaxPool2d``. Its gradient is not MLX's: where a window holds equal
maxima, MLX's max VJP shares the window's gradient among them, and PyTorch gives it whole to one
input, the one its forward records in ``max_indices``. Constant regions (letterbox padding in
YOLOv8's SPPF, ReLU's zeros) make such ties common, so a model trained here would take other
steps than ultralytics' or torchvision's. The VJP below follows PyTorch's CPU and CUDA kernels,
which scan a window row by row and take a value when it is ``> max`` or NaN:

- the whole gradient of a window goes to its first maximum in that order (the first tap inside
  the input when every value is ``-inf``);
- a window holding NaN gives it to its last NaN.

It is computed tap by tap: for each of the ``kH x kW`` window offsets, the strided slice of the
padded input at that offset, compared with the output, then placed back by a strided pad (zeros
between rows and columns) and summed. That is also the fast form on the CPU: the VJP of the
``as_strided`` window view is a single-threaded scatter-add there, 25-40x the pooling's own time
for ResNet's 3x3/s2 stem pool. Every implementation of the op carries this VJP (the CPU kernel's
traced calls take the reference; the CUDA kernel wraps it with ``with_reference_vjp``).
"""

from __future__ import annotations

import functools

import mlx.core as mx
import mlx.nn as nn

from .conv import dilate
from .registry import op


@functools.lru_cache(maxsize=64)
def mlx_pool(cls: type, kernel: tuple[int, int], stride: tuple[int, int],
             padding: tuple[int, int]) -> nn.Module:
    """MLX's pooling layer for these arguments; it holds no state, so one serves every call."""
    return cls(kernel, stride, padding)


def _taps(xp: mx.array, kernel: tuple[int, int], stride: tuple[int, int],
          out_hw: tuple[int, int]):
    """``((i, j), xp at window offset (i, j))`` for each offset in row-major order:
    ``(N, H', W', C)`` each."""
    (kh, kw), (sh, sw), (oh, ow) = kernel, stride, out_hw
    for i in range(kh):
        for j in range(kw):
            yield (i, j), xp[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :]


def _first_max_vjp(x: mx.array, y: mx.array, dy: mx.array, kernel: tuple[int, int],
                   stride: tuple[int, int], padding: tuple[int, int]) -> mx.array:
    """``dx`` ``(N, H, W, C)`` of ``y = max_pool2d(x)`` ``(N, H', W', C)`` for ``dy``, PyTorch's
    rule (module docstring)."""
    (ph, pw) = padding
    n, h, w, c = x.shape
    pad = [(0, 0), (ph, ph), (pw, pw), (0, 0)]
    xp = mx.pad(x, pad, constant_values=-float("inf"))
    # the padding is not an input: an all -inf window's gradient goes to its first real tap
    inside = mx.pad(mx.ones((1, h, w, 1), mx.bool_), pad, constant_values=False)
    out_hw = tuple(y.shape[1:3])
    taps = list(_taps(xp, kernel, stride, out_hw))
    insides = [t for _, t in _taps(inside, kernel, stride, out_hw)]
    nan_window = mx.isnan(y)
    first, taken = [], mx.zeros(y.shape, mx.bool_)
    for (_, t), t_in in zip(taps, insides):
        hit = (t == y) & t_in & ~taken
        taken = taken | hit
        first.append(hit)
    last_nan, taken = [None] * len(taps), mx.zeros(y.shape, mx.bool_)
    for k in reversed(range(len(taps))):
        hit = mx.isnan(taps[k][1]) & ~taken
        taken = taken | hit
        last_nan[k] = hit
    hp, wp = xp.shape[1:3]
    zero = mx.zeros((), dy.dtype)
    dxp = None
    for ((i, j), _), m, m_nan in zip(taps, first, last_nan):
        g = dilate(mx.where(mx.where(nan_window, m_nan, m), dy, zero), stride)
        g = mx.pad(g, [(0, 0), (i, hp - i - g.shape[1]), (j, wp - j - g.shape[2]), (0, 0)])
        dxp = g if dxp is None else dxp + g
    return dxp[:, ph:ph + h, pw:pw + w, :]


@functools.lru_cache(maxsize=64)
def _pool(kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int]):
    """MLX's max pooling with :func:`_first_max_vjp` as its VJP (one per argument set)."""
    pool = mlx_pool(nn.MaxPool2d, kernel, stride, padding)
    f = mx.custom_function(lambda x: pool(x))

    @f.vjp
    def _vjp(primals, dy, y):
        x = primals[0] if isinstance(primals, (list, tuple)) else primals
        return _first_max_vjp(x, y, dy, kernel, stride, padding)

    return f


@op("max_pool2d")
def max_pool2d(x: mx.array, kernel: tuple[int, int], stride: tuple[int, int],
               padding: tuple[int, int]) -> mx.array:
    """Max pooling, padding counting as -inf: ``(N, H, W, C)`` → ``(N, H', W', C)``; the
    gradient is PyTorch's (each window's to its first maximum, module docstring)."""
    return _pool(tuple(kernel), tuple(stride), tuple(padding))(x)
