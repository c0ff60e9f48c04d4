"""Layer normalisation over the last axis, and its channel-wise 2-D form."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from . import ops
from .device import Device
from .init import ONES, ZEROS
from .inputs import check_layer_input
from .module import Module
from .var_builder import VarBuilder


@dataclass(frozen=True)
class LayerNormConfig:
    """``eps``; ``remove_mean=False`` gives RMS norm; ``affine=False`` drops weight and bias."""

    eps: float = 1e-5
    remove_mean: bool = True
    affine: bool = True


class LayerNorm(Module):
    """Normalise over the last axis: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    Args:
        weight, bias: ``(D,)`` or ``None`` (``bias`` is unused when ``remove_mean=False``).

    Input ``(..., D)`` → same shape.
    """

    def __init__(self, weight: mx.array | None, bias: mx.array | None,
                 config: LayerNormConfig = LayerNormConfig(), *, device: Device) -> None:
        super().__init__(device)
        self.config = config
        if weight is not None:
            self.weight = weight
        if bias is not None:
            self.bias = bias

    @classmethod
    def load(cls, vb: VarBuilder, size: int,
             config: "LayerNormConfig | float" = LayerNormConfig()) -> "LayerNorm":
        """Read ``weight`` and ``bias`` ``(size,)`` when ``config.affine``; a float is an eps."""
        if not isinstance(config, LayerNormConfig):
            config = LayerNormConfig(eps=float(config))
        weight = vb.get((size,), "weight", ONES) if config.affine else None
        bias = vb.get((size,), "bias", ZEROS) if config.affine and config.remove_mean else None
        return cls(weight, bias, config, device=vb.device).loaded_from(vb)

    def candle_tensors(self, prefix: str) -> dict[str, mx.array]:
        """``weight`` and ``bias`` ``(D,)`` (those it has) under ``prefix``."""
        return {f"{prefix}.{k}": self[k] for k in ("weight", "bias") if k in self}

    def forward(self, x: mx.array) -> mx.array:
        w = self.get("weight")
        check_layer_input(x, type(self).__name__, spatial=False,
                          channels=None if w is None else w.shape[0])
        if self.config.remove_mean:
            return ops.layer_norm(x, w, self.get("bias"), self.config.eps)
        return mx.fast.rms_norm(x, w, self.config.eps)


class LayerNorm2d(LayerNorm):
    """SAM's LayerNorm2d: normalise each pixel over its channels.

    On NHWC tensors that is LayerNorm over the last axis. ``(N, H, W, C)`` → same shape;
    weights ``weight``/``bias`` ``(C,)``; eps defaults to 1e-6 as in SAM.
    """

    @classmethod
    def load(cls, vb: VarBuilder, num_channels: int,
             config: "LayerNormConfig | float" = LayerNormConfig(eps=1e-6)) -> "LayerNorm2d":
        return super().load(vb, num_channels, config)  # type: ignore[return-value]
