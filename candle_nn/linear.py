"""Linear layer: ``y = x @ W.T + b``."""

from __future__ import annotations

import math

import mlx.core as mx

from . import ops
from .device import Device
from .init import DEFAULT_KAIMING_NORMAL, Init
from .inputs import check_layer_input
from .module import Module
from .var_builder import VarBuilder


class Linear(Module):
    """Affine map over the last axis.

    Args:
        weight: ``(out_features, in_features)`` (candle/PyTorch layout).
        bias: ``(out_features,)`` or ``None``.
        device: where the weights live and the forward runs.

    Input ``(..., in_features)`` → output ``(..., out_features)``.
    """

    def __init__(self, weight: mx.array, bias: mx.array | None = None, *, device: Device) -> None:
        super().__init__(device)
        self.weight = weight
        if bias is not None:
            self.bias = bias

    @classmethod
    def load(cls, vb: VarBuilder, in_features: int, out_features: int,
             bias: bool = True) -> "Linear":
        """Read ``weight`` (and ``bias``) from ``vb``. Fresh variables follow candle's ``linear``
        (as our Conv2d follows candle's ``conv2d``): weight Kaiming-normal (fan in, ReLU gain:
        std sqrt(2 / in_features)), bias uniform in ±1/sqrt(in_features)."""
        bound = 1.0 / math.sqrt(in_features)
        weight = vb.get((out_features, in_features), "weight", DEFAULT_KAIMING_NORMAL)
        b = vb.get((out_features,), "bias", Init.uniform(-bound, bound)) if bias else None
        return cls(weight, b, device=vb.device).loaded_from(vb)

    def candle_tensors(self, prefix: str) -> dict[str, mx.array]:
        """``weight`` ``(out, in)`` and ``bias`` under ``prefix`` (see ``candle_nn.checkpoint``)."""
        out = {f"{prefix}.weight": self.weight}
        if "bias" in self:
            out[f"{prefix}.bias"] = self.bias
        return out

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[1])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def forward(self, x: mx.array, *, activation: str | None = None,
                residual: mx.array | None = None) -> mx.array:
        """``activation(x @ W.T + b) [+ residual]`` (``activation``: a name in
        ``candle_nn.ACTIVATIONS`` or ``None``; ``residual``: the output's shape, added last); on
        the CPU in float32 bias, activation and residual are fused into the product's pass."""
        check_layer_input(x, "Linear", spatial=False, channels=self.in_features)
        return ops.linear(x, self.weight, self.get("bias"), activation, residual)
