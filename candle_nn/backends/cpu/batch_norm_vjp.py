"""Train-mode BatchNorm's normalisation with its closed-form VJP, on the CPU.

MLX limitation: autodiff of the reference (``(x - mean) / sqrt(var + eps) * weight + bias``
with ``mean``, ``var`` BatchNorm2d's channel means of ``x``, summed in blocks for float32
accuracy, ops/reduce.py) differentiates those sums and broadcasts: 4-6x
the time of the closed form on the CPU. With ``x^ = (x - mean) / std`` and ``n`` values per
channel: ``dx = weight / std * (dy - sum(dy) / n - x^ sum(dy x^) / n)``, ``dweight = sum(dy x^)``,
``dbias = sum(dy)`` (channel sums in blocks too). ``dx`` carries the dependence
of ``mean`` and ``var`` on ``x``, so they get no gradient of their own. The forward is the
reference's expression. ``candle_nn.ops.disable("batch_norm_vjp")`` turns it off.
"""

from __future__ import annotations

import mlx.core as mx

from ...device import Device
from ...ops.reduce import channel_sum
from ...ops.registry import register
from . import kernels


@mx.custom_function
def _normalize(x, mean, var, weight, bias, eps):
    return (x - mean) * mx.rsqrt(var + eps) * weight + bias


@_normalize.vjp
def _normalize_vjp(primals, dy, y):
    with mx.stream(Device.cpu().stream):  # a CPU path's backward stays on the CPU (conv_grad.py)
        return _closed_form(primals, dy)


def _closed_form(primals, dy):
    x, mean, var, weight, _, eps = primals
    rstd = mx.rsqrt(var + eps)
    xhat = (x - mean) * rstd
    dbias = channel_sum(dy)
    dweight = channel_sum(dy * xhat)
    n = x.size // x.shape[-1]
    dx = (weight * rstd) * (dy - dbias / n - xhat * (dweight / n))
    zero = mx.zeros_like(mean)
    return dx, zero, zero, dweight, dbias, mx.zeros_like(eps)


def _applies(x, mean, var, weight, bias, eps) -> bool:
    return kernels.float32_cpu(x.dtype) and x.ndim >= 1 and all(
        a.dtype == mx.float32 and a.shape == (x.shape[-1],) for a in (mean, var, weight, bias))


@register("batch_norm_train", "batch_norm_vjp", "cpu", applies=_applies, grad="own",
          works_around="autodiff of the batch statistics' sums runs reductions and "
                       "broadcasts: 4-6x the closed-form gradient's time")
def batch_norm_train(x, mean, var, weight, bias, eps):
    return _normalize(x, mean, var, weight, bias, mx.array(eps, dtype=x.dtype))
