"""Activation functions, as plain functions and as a small stateless module.

``gelu`` is the exact (erf) GELU, PyTorch's default; ``gelu_tanh`` the tanh approximation.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx
import mlx.nn as nn

from . import cpu_fast, cpu_fast_gelu
from .module import Module


def relu(x: mx.array) -> mx.array:
    return mx.maximum(x, 0)


def silu(x: mx.array) -> mx.array:
    """``x * sigmoid(x)``. On the CPU, float32 takes a fused polynomial-exp path (cpu_fast.py)."""
    if cpu_fast.applies(x.dtype):
        return cpu_fast.silu_f32(x)
    return x * mx.sigmoid(x)


def sigmoid(x: mx.array) -> mx.array:
    return mx.sigmoid(x)


def gelu(x: mx.array) -> mx.array:
    """Exact GELU: ``x * Phi(x)``, elementwise on any shape. On the CPU, float32 takes a fused
    polynomial-erf path (cpu_fast_gelu.py, within 1e-6 of exact erf); elsewhere it is MLX's own
    ``mlx.nn.gelu``."""
    if cpu_fast.applies(x.dtype):
        return cpu_fast_gelu.gelu_f32(x)
    return nn.gelu(x)


def gelu_tanh(x: mx.array) -> mx.array:
    """Tanh-approximated GELU, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, elementwise on
    any shape: MLX's own ``mlx.nn.gelu_approx`` (PyTorch's ``gelu(approximate="tanh")``)."""
    return nn.gelu_approx(x)


def softmax(x: mx.array, axis: int = -1) -> mx.array:
    """Numerically stable softmax over ``axis`` (computed in at least float32 precision)."""
    return mx.softmax(x, axis=axis, precise=True)


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
