"""1-D convolutions on NLC sequences (``(N, L, C)``).

Weights are read in candle/PyTorch layout and converted once, at load, to MLX's:

* :class:`Conv1d`: ``(O, I/groups, k)`` → ``(O, k, I/groups)``.
* :class:`ConvTranspose1d`: ``(I, O/groups, k)`` → ``(O, k, I/groups)`` (the equivalent
  correlation's weight, kept un-flipped; flipped at call).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx

from .checkpoint import check_conv_layout
from .device import Device
from .errors import ShapeMismatchError
from .init import DEFAULT_KAIMING_NORMAL, Init
from .module import Module
from .var_builder import VarBuilder


@dataclass(frozen=True)
class Conv1dConfig:
    """Padding (zeros, both ends), stride, dilation and groups (candle's ``Conv1dConfig``)."""

    padding: int = 0
    stride: int = 1
    dilation: int = 1
    groups: int = 1


@dataclass(frozen=True)
class ConvTranspose1dConfig:
    """Padding, output padding, stride, dilation and groups (PyTorch's ``ConvTranspose1d``)."""

    padding: int = 0
    output_padding: int = 0
    stride: int = 1
    dilation: int = 1
    groups: int = 1


def _check_groups(vb: VarBuilder, cin: int, cout: int, groups: int) -> None:
    if groups < 1 or cin % groups or cout % groups:
        raise ShapeMismatchError(f"{vb.path('weight')}: channels {cin}->{cout} are not divisible "
                                 f"by groups={groups}")


class Conv1d(Module):
    """1-D convolution (cross-correlation, as PyTorch's ``Conv1d``).

    Args:
        weight: ``(out_channels, k, in_channels / groups)`` (MLX layout).
        bias: ``(out_channels,)`` or ``None``.

    Input ``(N, L, in_channels)`` → ``(N, L', out_channels)``,
    ``L' = (L + 2 p - d (k - 1) - 1) // s + 1``.
    """

    def __init__(self, weight: mx.array, bias: mx.array | None = None,
                 config: Conv1dConfig | None = None, *, device: Device) -> None:
        super().__init__(device)
        self.config = Conv1dConfig() if config is None else config
        self.weight = weight
        if bias is not None:
            self.bias = bias

    @classmethod
    def load(cls, vb: VarBuilder, in_channels: int, out_channels: int, kernel_size: int,
             config: Conv1dConfig = Conv1dConfig(), bias: bool = True) -> "Conv1d":
        """Read ``weight`` ``(O, I/groups, k)`` (and ``bias``) from ``vb``; fresh variables as
        :meth:`Conv2d.load`."""
        _check_groups(vb, in_channels, out_channels, config.groups)
        shape = (out_channels, in_channels // config.groups, kernel_size)
        check_conv_layout(vb, "weight", shape, (out_channels, kernel_size, shape[1]),
                          "(O, I/groups, k)")
        weight = vb.get(shape, "weight", DEFAULT_KAIMING_NORMAL)
        b = None
        if bias:
            bound = 1.0 / math.sqrt(shape[1] * kernel_size)
            b = vb.get((out_channels,), "bias", Init.uniform(-bound, bound))
        with mx.stream(vb.device.stream):
            weight = mx.contiguous(weight.transpose(0, 2, 1))
        return cls(weight, b, config, device=vb.device).loaded_from(vb)

    def candle_tensors(self, prefix: str) -> dict[str, mx.array]:
        """``weight`` ``(O, I/groups, k)`` and ``bias`` under ``prefix``."""
        out = {f"{prefix}.weight": mx.contiguous(self.weight.transpose(0, 2, 1))}
        if "bias" in self:
            out[f"{prefix}.bias"] = self.bias
        return out

    def forward(self, x: mx.array) -> mx.array:
        c = self.config
        y = mx.conv1d(x, self.weight, stride=c.stride, padding=c.padding, dilation=c.dilation,
                      groups=c.groups)
        return y + self.bias if "bias" in self else y


class ConvTranspose1d(Module):
    """1-D transposed convolution (PyTorch's ``ConvTranspose1d``).

    Args:
        weight: ``(out_channels, k, in_channels / groups)`` (MLX layout, see the module doc).
        bias: ``(out_channels,)`` or ``None``.

    Input ``(N, L, in_channels)`` → ``(N, L', out_channels)``,
    ``L' = (L - 1) s - 2 p + d (k - 1) + output_padding + 1``.
    """

    def __init__(self, weight: mx.array, bias: mx.array | None = None,
                 config: ConvTranspose1dConfig | None = None, *, device: Device) -> None:
        super().__init__(device)
        self.config = ConvTranspose1dConfig() if config is None else config
        self.weight = weight
        if bias is not None:
            self.bias = bias

    @classmethod
    def load(cls, vb: VarBuilder, in_channels: int, out_channels: int, kernel_size: int,
             config: ConvTranspose1dConfig = ConvTranspose1dConfig(),
             bias: bool = True) -> "ConvTranspose1d":
        """Read ``weight`` ``(I, O/groups, k)`` (PyTorch layout) and ``bias`` from ``vb``."""
        g = config.groups
        _check_groups(vb, in_channels, out_channels, g)
        shape = (in_channels, out_channels // g, kernel_size)
        check_conv_layout(vb, "weight", shape, (out_channels, kernel_size, in_channels // g),
                          "(I, O/groups, k)")
        weight = vb.get(shape, "weight", DEFAULT_KAIMING_NORMAL)
        b = None
        if bias:
            bound = 1.0 / math.sqrt(shape[1] * kernel_size)
            b = vb.get((out_channels,), "bias", Init.uniform(-bound, bound))
        with mx.stream(vb.device.stream):  # (g, I/g, O/g, k) -> (g, O/g, k, I/g) -> (O, k, I/g)
            w = weight.reshape(g, in_channels // g, out_channels // g, kernel_size)
            weight = mx.contiguous(w.transpose(0, 2, 3, 1).reshape(out_channels, kernel_size,
                                                                   in_channels // g))
        return cls(weight, b, config, device=vb.device).loaded_from(vb)

    def candle_tensors(self, prefix: str) -> dict[str, mx.array]:
        """``weight`` ``(I, O/groups, k)`` and ``bias`` under ``prefix``."""
        out, k, cig = self.weight.shape
        g = self.config.groups
        w = self.weight.reshape(g, out // g, k, cig).transpose(0, 3, 1, 2)
        result = {f"{prefix}.weight": mx.contiguous(w.reshape(g * cig, out // g, k))}
        if "bias" in self:
            result[f"{prefix}.bias"] = self.bias
        return result

    def forward(self, x: mx.array) -> mx.array:
        # The transposed conv as a correlation of the zero-upsampled, fully padded input with the
        # flipped kernel (MLX's conv_transpose is avoided: see conv.py), then PyTorch's padding
        # cropped and output_padding appended (zeros before the bias).
        c = self.config
        n, length, cin = x.shape
        _, k, _ = self.weight.shape
        if c.stride > 1:
            x = mx.pad(x[:, :, None, :], [(0, 0), (0, 0), (0, c.stride - 1), (0, 0)])
            x = x.reshape(n, length * c.stride, cin)[:, :(length - 1) * c.stride + 1]
        full = c.dilation * (k - 1)
        x = mx.pad(x, [(0, 0), (full, full), (0, 0)])
        y = mx.conv1d(x, self.weight[:, ::-1, :], dilation=c.dilation, groups=c.groups)
        full_length = y.shape[1]
        extra = max(c.output_padding - c.padding, 0)
        if extra:
            y = mx.pad(y, [(0, 0), (0, extra), (0, 0)])
        y = y[:, c.padding:full_length - c.padding + c.output_padding]
        return y + self.bias if "bias" in self else y
