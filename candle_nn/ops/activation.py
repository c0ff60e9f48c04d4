"""Element-wise ops: activations, softmax and a layer's epilogue (bias, residual, activation).

``gelu`` is the exact (erf) GELU, PyTorch's default; ``gelu_tanh`` the tanh approximation.
:func:`bias_act` is the epilogue ``Conv2d`` and ``Linear`` take as ``activation=`` /
``residual=``.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx
import mlx.nn as nn

from .registry import op


def relu(x: mx.array) -> mx.array:
    return mx.maximum(x, 0)


@op("silu")
def silu(x: mx.array) -> mx.array:
    """``x * sigmoid(x)``, elementwise on any shape."""
    return x * mx.sigmoid(x)


@op("sigmoid")
def sigmoid(x: mx.array) -> mx.array:
    """``1 / (1 + exp(-x))``, elementwise on any shape."""
    return mx.sigmoid(x)


@op("gelu")
def gelu(x: mx.array) -> mx.array:
    """Exact GELU: ``x * Phi(x)``, elementwise on any shape (MLX's ``mlx.nn.gelu``)."""
    return nn.gelu(x)


def gelu_tanh(x: mx.array) -> mx.array:
    """Tanh-approximated GELU, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, elementwise on
    any shape: MLX's own ``mlx.nn.gelu_approx`` (PyTorch's ``gelu(approximate="tanh")``)."""
    return nn.gelu_approx(x)


@op("softmax")
def softmax(x: mx.array, axis: int = -1) -> mx.array:
    """Numerically stable softmax over ``axis`` (computed in at least float32 precision)."""
    return mx.softmax(x, axis=axis, precise=True)


def check_activation(activation: str | None) -> None:
    """Raise ``ValueError`` unless ``activation`` is ``None`` or a name in :data:`ACTIVATIONS`."""
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")


@op("bias_act")
def bias_act(y: mx.array, bias: mx.array | None = None, activation: str | None = None,
             residual: mx.array | None = None, residual_after_activation: bool = False
             ) -> mx.array:
    """A layer's epilogue: ``activation(y + bias + residual)``, or with
    ``residual_after_activation`` ``activation(y + bias) + residual``.

    ``y`` ``(..., C)``, ``bias`` ``(C,)``, ``residual`` ``y``'s shape; ``activation`` a name in
    :data:`ACTIVATIONS` or ``None``.
    """
    check_activation(activation)
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
