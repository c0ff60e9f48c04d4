"""Inference-mode batch normalisation over the channel axis of NHWC tensors."""

from __future__ import annotations

import mlx.core as mx

from .device import Device
from .init import ONES, ZEROS
from .module import Module
from .var_builder import VarBuilder


class BatchNorm2d(Module):
    """``y = (x - running_mean) / sqrt(running_var + eps) * weight + bias`` per channel.

    Args:
        running_mean, running_var, weight, bias: ``(C,)`` each.
        eps: added to the variance (PyTorch's default 1e-5; YOLOv8 uses 1e-3).

    Input ``(N, H, W, C)`` (or any ``(..., C)``) → same shape. Fold it into the preceding
    convolution with :meth:`Conv2d.fold_batch_norm` to save one pass over the activations.
    """

    def __init__(self, running_mean: mx.array, running_var: mx.array, weight: mx.array,
                 bias: mx.array, eps: float = 1e-5, *, device: Device) -> None:
        super().__init__(device)
        self.running_mean = running_mean
        self.running_var = running_var
        self.weight = weight
        self.bias = bias
        self.eps = float(eps)

    @classmethod
    def load(cls, vb: VarBuilder, num_features: int, eps: float = 1e-5) -> "BatchNorm2d":
        """Read ``running_mean``, ``running_var``, ``weight``, ``bias`` (each ``(C,)``)."""
        shape = (num_features,)
        return cls(vb.get(shape, "running_mean", ZEROS), vb.get(shape, "running_var", ONES),
                   vb.get(shape, "weight", ONES), vb.get(shape, "bias", ZEROS), eps,
                   device=vb.device).loaded_from(vb)

    def candle_tensors(self, prefix: str) -> dict[str, mx.array]:
        """``running_mean``, ``running_var``, ``weight``, ``bias`` ``(C,)`` under ``prefix``."""
        names = ("running_mean", "running_var", "weight", "bias")
        return {f"{prefix}.{k}": self[k] for k in names}

    def scale_shift(self) -> tuple[mx.array, mx.array]:
        """Per-channel ``(scale, shift)`` with ``bn(x) == x * scale + shift``, computed in
        float32."""
        var = self.running_var.astype(mx.float32)
        scale = self.weight.astype(mx.float32) * mx.rsqrt(var + self.eps)
        shift = self.bias.astype(mx.float32) - self.running_mean.astype(mx.float32) * scale
        return scale, shift

    def forward(self, x: mx.array) -> mx.array:
        scale, shift = self.scale_shift()
        return x * scale.astype(x.dtype) + shift.astype(x.dtype)


def batch_norm(num_features: int, eps: float, vb: VarBuilder) -> BatchNorm2d:
    """candle's ``batch_norm``."""
    return BatchNorm2d.load(vb, num_features, eps)
