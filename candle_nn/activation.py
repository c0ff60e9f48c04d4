"""Activation functions, as plain functions and as a small stateless module.

``gelu`` is the exact (erf) GELU, PyTorch's default; ``gelu_tanh`` the tanh approximation.
:func:`bias_act` is a layer's epilogue (bias, residual, activation), which ``Conv2d`` and ``Linear``
take as ``activation=`` / ``residual=``: one fused pass on the CPU (cpu_fast.py).
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx
import mlx.nn as nn

from . import cpu_fast
from .module import Module


def relu(x: mx.array) -> mx.array:
    return mx.maximum(x, 0)


def silu(x: mx.array) -> mx.array:
    """``x * sigmoid(x)``. On the CPU, float32 takes a fused polynomial-exp path (cpu_fast.py)."""
    if cpu_fast.applies(x.dtype):
        return cpu_fast.silu(x)
    return x * mx.sigmoid(x)


def sigmoid(x: mx.array) -> mx.array:
    return mx.sigmoid(x)


def gelu(x: mx.array) -> mx.array:
    """Exact GELU: ``x * Phi(x)``, elementwise on any shape. On the CPU, float32 takes a fused
    polynomial-erf path (cpu_fast_gelu.py, within 1e-6 of exact erf); elsewhere it is MLX's own
    ``mlx.nn.gelu``."""
    if cpu_fast.applies(x.dtype):
        return cpu_fast.gelu(x)
    return nn.gelu(x)


def gelu_tanh(x: mx.array) -> mx.array:
    """Tanh-approximated GELU, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, elementwise on
    any shape: MLX's own ``mlx.nn.gelu_approx`` (PyTorch's ``gelu(approximate="tanh")``)."""
    return nn.gelu_approx(x)


def softmax(x: mx.array, axis: int = -1) -> mx.array:
    """Numerically stable softmax over ``axis`` (computed in at least float32 precision)."""
    if axis in (-1, x.ndim - 1):
        fast = cpu_fast.softmax_last(x)
        if fast is not None:
            return fast
    return mx.softmax(x, axis=axis, precise=True)


def bias_act(y: mx.array, bias: mx.array | None = None, activation: str | None = None,
             residual: mx.array | None = None, *, residual_after_activation: bool = False
             ) -> mx.array:
    """A layer's epilogue: ``activation(y + bias + residual)``, or with
    ``residual_after_activation`` ``activation(y + bias) + residual``.

    ``y`` ``(..., C)``, ``bias`` ``(C,)``, ``residual`` ``y``'s shape; ``activation`` a name in
    :data:`ACTIVATIONS` or ``None``. On the CPU in float32 it is one multithreaded pass
    (cpu_fast.bias_act); elsewhere the same ops one after another.
    """
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
    fused = cpu_fast.bias_act(y, bias, activation, residual, residual_after_activation)
    if fused is not None:
        return fused
    if bias is not None:
        y = y + bias
    if residual is not None and not residual_after_activation:
        y = y + residual
    if activation is not None:
        y = ACTIVATIONS[activation](y)
    if residual is not None and residual_after_activation:
        y = y + residual
    return y


ACTIVATIONS: dict[str, Callable[[mx.array], mx.array]] = {
    "relu": relu, "silu": silu, "swish": silu, "sigmoid": sigmoid, "gelu": gelu,
    "gelu_erf": gelu, "gelu_tanh": gelu_tanh, "identity": lambda x: x,
}


class Activation(Module):
    """A named activation as a module: ``Activation("silu")(x)``; see ``ACTIVATIONS``."""

    def __init__(self, name: str) -> None:
        if name not in ACTIVATIONS:
            raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")
        super().__init__(None)
        self.name = name

    def forward(self, x: mx.array) -> mx.array:
        return ACTIVATIONS[self.name](x)
