"""Activation functions, as plain functions (the ops in ``candle_nn.ops.activation``) and as a
small stateless module."""

from __future__ import annotations

import mlx.core as mx

from .module import Module
from .ops.activation import (  # noqa: F401  (re-exported: candle_nn's public names)
    ACTIVATIONS, bias_act, gelu, gelu_tanh, relu, sigmoid, silu, softmax,
)


class Activation(Module):
    """A named activation as a module: ``Activation("silu")(x)``; see ``ACTIVATIONS``."""

    def __init__(self, name: str) -> None:
        if name not in ACTIVATIONS:
            raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")
        super().__init__(None)
        self.name = name

    def forward(self, x: mx.array) -> mx.array:
        return ACTIVATIONS[self.name](x)
