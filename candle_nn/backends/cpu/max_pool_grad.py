"""Max pooling with a VJP of strided slices and pads, for training on the CPU.

MLX limitation: ``nn.MaxPool2d`` is a max over an ``as_strided`` view of the padded input, and
the VJP of ``as_strided`` is a scatter-add, single-threaded: 25-40x the pooling's own time for
ResNet's 3x3/s2 stem pool. Here the gradient is the same math, tap by tap: for each of the
``kH x kW`` window offsets, the input values at that offset that equal the window's maximum get
``dy / (number of maxima in the window)`` (MLX's max VJP shares a tie equally), placed back by
a strided pad (zeros between rows and columns) and summed.

Runs only under a transformation (tracer inputs; the forward is the reference's); concrete calls
return ``None`` (the reference runs). ``candle_nn.ops.disable("max_pool_grad")`` turns it off.
"""

from __future__ import annotations

import mlx.core as mx

from ...ops.pooling import max_pool2d as max_pool2d_op
from ...ops.registry import register
from . import kernels
from .conv_grad import dilate


def _taps(xp: mx.array, kernel: tuple[int, int], stride: tuple[int, int],
          out_hw: tuple[int, int]):
    """``((i, j), x at window offset (i, j))`` for each offset: ``(N, H', W', C)`` each."""
    (kh, kw), (sh, sw), (oh, ow) = kernel, stride, out_hw
    for i in range(kh):
        for j in range(kw):
            yield (i, j), xp[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :]


def _pool(kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int]):
    (ph, pw) = padding

    def forward(x):
        return max_pool2d_op.reference(x, kernel, stride, padding)

    f = mx.custom_function(forward)

    @f.vjp
    def _vjp(primals, dy, y):
        x = primals[0] if isinstance(primals, (list, tuple)) else primals
        n, h, w, c = x.shape
        xp = mx.pad(x, [(0, 0), (ph, ph), (pw, pw), (0, 0)], constant_values=-float("inf"))
        hp, wp = xp.shape[1:3]
        out_hw = tuple(y.shape[1:3])
        # A window whose maximum is NaN passes NaN to each of its inputs, as the reference's VJP
        nan_window = mx.isnan(y)
        masks = [(ij, (t == y) | nan_window) for ij, t in _taps(xp, kernel, stride, out_hw)]
        count = sum(m.astype(dy.dtype) for _, m in masks)
        share = mx.where(nan_window, mx.array(float("nan"), dy.dtype), dy / count)
        dxp = None
        for (i, j), m in masks:
            g = dilate(mx.where(m, share, 0), stride)
            g = mx.pad(g, [(0, 0), (i, hp - i - g.shape[1]), (j, wp - j - g.shape[2]), (0, 0)])
            dxp = g if dxp is None else dxp + g
        return dxp[:, ph:ph + h, pw:pw + w, :]

    return f


_POOLS: dict[tuple, object] = {}


def applies(x, kernel, stride, padding) -> bool:
    """A 4-D float CPU input (the pooling runs on MLX's CPU stream)."""
    return x.ndim == 4 and mx.issubdtype(x.dtype, mx.floating) \
        and mx.default_device() == mx.cpu


@register("max_pool2d", "max_pool_grad", "cpu", applies=applies, available=kernels.loaded,
          grad="own", works_around="MLX's max pool VJP is a single-threaded scatter-add")
def max_pool2d(x, kernel, stride, padding):
    """The reference's pooling with this module's VJP; ``None`` (the reference) for a concrete
    ``x`` (inference)."""
    if not kernels.module().is_tracer(x):
        return None
    key = (tuple(kernel), tuple(stride), tuple(padding))
    if key not in _POOLS:
        _POOLS[key] = _pool(*key)
    return _POOLS[key](x)
