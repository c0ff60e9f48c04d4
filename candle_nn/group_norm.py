"""Group normalisation over the channel (last) axis of channels-last tensors."""

from __future__ import annotations

import mlx.core as mx

from .device import Device
from .errors import ShapeMismatchError
from .init import ONES, ZEROS
from .module import Module
from .var_builder import VarBuilder


class GroupNorm(Module):
    """PyTorch's ``GroupNorm``: channels split into ``num_groups`` groups, each normalised over
    its channels and every spatial position of one sample, then ``* weight + bias`` per channel.

    Args:
        num_groups: divides the channel count.
        weight, bias: ``(C,)`` or ``None`` (not affine).
        eps: added to the variance (PyTorch's default 1e-5).

    Input ``(N, ..., C)`` (NHWC images, NLC sequences) → same shape.
    """

    def __init__(self, num_groups: int, weight: mx.array | None, bias: mx.array | None,
                 eps: float = 1e-5, *, device: Device) -> None:
        super().__init__(device)
        self.num_groups = int(num_groups)
        self.eps = float(eps)
        if weight is not None:
            self.weight = weight
        if bias is not None:
            self.bias = bias

    @classmethod
    def load(cls, vb: VarBuilder, num_groups: int, num_channels: int, eps: float = 1e-5,
             affine: bool = True) -> "GroupNorm":
        """Read ``weight`` and ``bias`` ``(C,)`` (fresh: ones and zeros) unless not ``affine``."""
        if num_groups < 1 or num_channels % num_groups:
            raise ShapeMismatchError(f"{vb.prefix or 'GroupNorm'}: {num_channels} channels do "
                                     f"not split into {num_groups} groups")
        weight = bias = None
        if affine:
            weight = vb.get((num_channels,), "weight", ONES)
            bias = vb.get((num_channels,), "bias", ZEROS)
        return cls(num_groups, weight, bias, eps, device=vb.device).loaded_from(vb)

    def forward(self, x: mx.array) -> mx.array:
        n, c = x.shape[0], x.shape[-1]
        if c % self.num_groups:
            raise ShapeMismatchError(f"GroupNorm: input has {c} channels, not a multiple of "
                                     f"{self.num_groups} groups")
        xf = x.astype(mx.float32).reshape(n, -1, self.num_groups, c // self.num_groups)
        mean = xf.mean(axis=(1, 3), keepdims=True)
        var = mx.square(xf - mean).mean(axis=(1, 3), keepdims=True)
        y = ((xf - mean) * mx.rsqrt(var + self.eps)).reshape(x.shape)
        if "weight" in self:
            y = y * self.weight
        if "bias" in self:
            y = y + self.bias
        return y.astype(x.dtype)
