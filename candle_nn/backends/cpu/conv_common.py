"""What the CPU conv implementations share: when they apply, and running an epilogue the
kernels lack (tanh GELU) after them."""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from ...ops.activation import bias_act
from . import kernels
from .elementwise import ACT, act_code, residual_mode


def conv_applies(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
                 activation=None, residual=None, residual_after_activation=False) -> bool:
    """A groups-1, dilation-1 float32 conv of a 4-D ``x`` on the CPU."""
    return (groups == 1 and tuple(dilation) == (1, 1) and x.ndim == 4
            and kernels.float32_cpu(x.dtype) and weight.dtype == mx.float32
            and (bias is None or bias.dtype == mx.float32)
            and (residual is None or residual.dtype == mx.float32))


def with_epilogue(run: Callable, x, weight, bias, stride, padding, activation, residual,
                  residual_after_activation) -> mx.array | None:
    """``run(x, weight, bias, stride, padding, act, residual, mode)`` with the epilogue fused
    when the kernels have the activation, else fused up to the bias and the rest by
    :func:`~candle_nn.ops.bias_act`."""
    kernels.sync_threads()
    if activation in ACT:
        return run(x, weight, bias, stride, padding, act_code(activation), residual,
                   residual_mode(residual, residual_after_activation))
    y = run(x, weight, bias, stride, padding, act_code(None), None, residual_mode(None, False))
    if y is None:
        return None
    return bias_act(y, None, activation, residual, residual_after_activation)
