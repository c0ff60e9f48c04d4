"""2-D convolutions on NHWC images.

Weights are read in candle/PyTorch layout and converted once, at load, to MLX's layout:

* :class:`Conv2d`: ``(O, I/groups, kH, kW)`` → ``(O, kH, kW, I/groups)``.
* :class:`ConvTranspose2d`: ``(I, O, kH, kW)`` → ``(O, kH, kW, I)``.

Inputs and outputs are ``(N, H, W, C)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx

from . import ops
from .batch_norm import BatchNorm2d
from .checkpoint import check_conv_layout
from .device import Device
from .errors import ShapeMismatchError
from .init import DEFAULT_KAIMING_NORMAL, Init
from .inputs import check_layer_input
from .module import Module, check_same_device
from .pairs import pair as _pair
from .var_builder import VarBuilder


@dataclass(frozen=True)
class Conv2dConfig:
    """Padding (zeros, both sides), stride, dilation and groups; ints or ``(h, w)`` pairs."""

    padding: "int | tuple[int, int]" = 0
    stride: "int | tuple[int, int]" = 1
    dilation: "int | tuple[int, int]" = 1
    groups: int = 1


class _Conv(Module):
    """What both convolutions hold: an MLX-layout ``weight``, an optional ``bias``
    ``(out_channels,)`` and a config (``None``: the class's default ``Config()``)."""

    Config: type

    def __init__(self, weight: mx.array, bias: mx.array | None = None,
                 config: "Conv2dConfig | ConvTranspose2dConfig | None" = None, *,
                 device: Device) -> None:
        super().__init__(device)
        self.config = self.Config() if config is None else config
        self.weight = weight
        if bias is not None:
            self.bias = bias


class Conv2d(_Conv):
    """2-D convolution.

    Args:
        weight: ``(out_channels, kH, kW, in_channels / groups)`` (MLX layout).
        bias: ``(out_channels,)`` or ``None``.
        config: padding / stride / dilation / groups (:class:`Conv2dConfig`).
        device: where the weights live and the forward runs.

    Input ``(N, H, W, in_channels)`` → output ``(N, H', W', out_channels)``.
    """

    Config = Conv2dConfig

    @classmethod
    def load(cls, vb: VarBuilder, in_channels: int, out_channels: int,
             kernel_size: "int | tuple[int, int]", config: Conv2dConfig = Conv2dConfig(),
             bias: bool = True) -> "Conv2d":
        """Read ``weight`` ``(O, I/groups, kH, kW)`` (and ``bias``) from ``vb``.

        Fresh variables: weight Kaiming-normal (fan in, ReLU gain), bias uniform ±1/sqrt(fan_in).
        """
        kh, kw = _pair(kernel_size)
        if in_channels % config.groups or out_channels % config.groups:
            raise ShapeMismatchError(
                f"{vb.path('weight')}: channels {in_channels}->{out_channels} are not divisible "
                f"by groups={config.groups}"
            )
        shape = (out_channels, in_channels // config.groups, kh, kw)
        check_conv_layout(vb, "weight", shape, (out_channels, kh, kw, shape[1]),
                          "(O, I/groups, kH, kW)")
        weight = vb.get(shape, "weight", DEFAULT_KAIMING_NORMAL)
        b = None
        if bias:
            bound = 1.0 / math.sqrt(shape[1] * kh * kw)
            b = vb.get((out_channels,), "bias", Init.uniform(-bound, bound))
        with mx.stream(vb.device.stream):
            weight = mx.contiguous(weight.transpose(0, 2, 3, 1))
        return cls(weight, b, config, device=vb.device).loaded_from(vb)

    @classmethod
    def load_with_bn(cls, vb: VarBuilder, in_channels: int, out_channels: int,
                     kernel_size: "int | tuple[int, int]", config: Conv2dConfig = Conv2dConfig(),
                     *, conv: str = "conv", bn: str = "bn", eps: float = 1e-5) -> "Conv2d":
        """A conv without bias at ``vb.pp(conv)`` followed by a :class:`BatchNorm2d` at
        ``vb.pp(bn)`` (``eps``), loaded as one Conv2d with the BatchNorm absorbed
        (:meth:`absorb_bn`; inference only). The checkpoint keeps both layers' names."""
        layer = cls.load(vb.pp(conv), in_channels, out_channels, kernel_size, config, bias=False)
        return layer.absorb_bn(BatchNorm2d.load(vb.pp(bn), out_channels, eps))

    def candle_tensors(self, prefix: str) -> dict[str, mx.array]:
        """``weight`` ``(O, I/groups, kH, kW)`` and ``bias`` under ``prefix``; a conv with a
        folded BatchNorm adds that BatchNorm as an identity carrying the shift (see
        ``candle_nn.checkpoint``)."""
        out = {f"{prefix}.weight": mx.contiguous(self.weight.transpose(0, 3, 1, 2))}
        folded = self._folded_bn
        if folded is None:
            if "bias" in self:
                out[f"{prefix}.bias"] = self.bias
            return out
        bn_prefix, eps, conv_had_bias = folded
        n, dtype = self.out_channels, self.bias.dtype
        zeros = mx.zeros((n,), dtype=dtype)
        if conv_had_bias:
            out[f"{prefix}.bias"] = self.bias
        out.update({f"{bn_prefix}.running_mean": zeros,
                    # float32(1 - eps) + eps == 1 exactly, so the BatchNorm's scale is exactly 1
                    f"{bn_prefix}.running_var": mx.full((n,), 1.0 - mx.array(eps), dtype=dtype),
                    f"{bn_prefix}.weight": mx.ones((n,), dtype=dtype),
                    f"{bn_prefix}.bias": zeros if conv_had_bias else self.bias})
        return out

    @property
    def _folded_bn(self) -> "tuple[str, float, bool] | None":
        """``(BatchNorm prefix, eps, conv had a bias)`` when a BatchNorm was folded in."""
        return self.__dict__.get("_folded_bn_info")

    @property
    def out_channels(self) -> int:
        return int(self.weight.shape[0])

    def forward(self, x: mx.array, *, activation: str | None = None,
                residual: mx.array | None = None,
                residual_after_activation: bool = False) -> mx.array:
        """``activation(conv(x) + bias + residual)``; ``residual_after_activation``:
        ``activation(conv(x) + bias) + residual``. ``activation`` is a name in
        ``candle_nn.ACTIVATIONS`` or ``None``, ``residual`` has the output's shape. On the CPU in
        float32 the epilogue is one fused multithreaded pass (``candle_nn.ops.conv2d``)."""
        c = self.config
        check_layer_input(x, "Conv2d", spatial=True, channels=self.weight.shape[-1] * c.groups)
        args = (x, self.weight, self.get("bias"), _pair(c.stride), _pair(c.padding),
                _pair(c.dilation))
        epilogue = dict(activation=activation, residual=residual,
                        residual_after_activation=residual_after_activation)
        if ops.is_depthwise(x, self.weight, c.groups):
            return ops.depthwise_conv2d(*args, **epilogue)
        return ops.conv2d(*args, c.groups, **epilogue)

    def absorb_bn(self, bn: BatchNorm2d) -> "Conv2d":
        """A new Conv2d equal to ``bn(self(x))`` (inference), with the BN folded in (candle's
        ``Conv2d::absorb_bn``)."""
        if not isinstance(bn, BatchNorm2d):
            raise TypeError(f"absorb_bn expects a BatchNorm2d, not {type(bn).__name__}")
        check_same_device("Conv2d.absorb_bn", self.device, bn.device, "the Conv2d",
                          "the BatchNorm2d")
        if bn.weight.shape[0] != self.out_channels:
            raise ShapeMismatchError(
                f"Conv2d.absorb_bn: the BatchNorm2d has {bn.weight.shape[0]} channels, "
                f"the Conv2d {self.out_channels} output channels"
            )
        with self.on_device():
            scale, shift = bn.scale_shift()
            weight = self.weight * scale.reshape(-1, 1, 1, 1).astype(self.weight.dtype)
            bias = self.bias * scale + shift if "bias" in self else shift
            bias = bias.astype(self.weight.dtype)
        folded = Conv2d(weight, bias, self.config, device=self.device)
        if self.weights_prefix is not None and bn.weights_prefix is not None:
            object.__setattr__(folded, "_weights_prefix", self.weights_prefix)
            object.__setattr__(folded, "_folded_bn_info",
                               (bn.weights_prefix, bn.eps, "bias" in self))
        for vm in self.__dict__.get("_varmaps", ()):
            vm.track(folded)
        return folded


@dataclass(frozen=True)
class ConvTranspose2dConfig:
    """Padding, output padding, stride and dilation (as PyTorch's ConvTranspose2d)."""

    padding: "int | tuple[int, int]" = 0
    output_padding: "int | tuple[int, int]" = 0
    stride: "int | tuple[int, int]" = 1
    dilation: "int | tuple[int, int]" = 1


class ConvTranspose2d(_Conv):
    """2-D transposed convolution (groups = 1).

    Args:
        weight: ``(out_channels, kH, kW, in_channels)`` (MLX layout).
        bias: ``(out_channels,)`` or ``None``.
        config: padding / output padding / stride / dilation (:class:`ConvTranspose2dConfig`).

    Input ``(N, H, W, in_channels)`` → output ``(N, H', W', out_channels)`` with
    ``H' = (H - 1) * stride - 2 * padding + dilation * (kH - 1) + output_padding + 1``.
    """

    Config = ConvTranspose2dConfig

    @classmethod
    def load(cls, vb: VarBuilder, in_channels: int, out_channels: int,
             kernel_size: "int | tuple[int, int]",
             config: ConvTranspose2dConfig = ConvTranspose2dConfig(),
             bias: bool = True) -> "ConvTranspose2d":
        """Read ``weight`` ``(I, O, kH, kW)`` (PyTorch layout) and ``bias`` from ``vb``."""
        kh, kw = _pair(kernel_size)
        check_conv_layout(vb, "weight", (in_channels, out_channels, kh, kw),
                          (out_channels, kh, kw, in_channels), "(I, O, kH, kW)")
        weight = vb.get((in_channels, out_channels, kh, kw), "weight", DEFAULT_KAIMING_NORMAL)
        b = None
        if bias:
            bound = 1.0 / math.sqrt(out_channels * kh * kw)
            b = vb.get((out_channels,), "bias", Init.uniform(-bound, bound))
        with mx.stream(vb.device.stream):
            weight = mx.contiguous(weight.transpose(1, 2, 3, 0))
        return cls(weight, b, config, device=vb.device).loaded_from(vb)

    def candle_tensors(self, prefix: str) -> dict[str, mx.array]:
        """``weight`` ``(I, O, kH, kW)`` and ``bias`` under ``prefix``."""
        out = {f"{prefix}.weight": mx.contiguous(self.weight.transpose(3, 0, 1, 2))}
        if "bias" in self:
            out[f"{prefix}.bias"] = self.bias
        return out

    def forward(self, x: mx.array, *, activation: str | None = None) -> mx.array:
        """``activation(conv_transpose(x) + bias)`` (``activation``: a name in
        ``candle_nn.ACTIVATIONS`` or ``None``); on the CPU in float32 bias and activation are one
        fused multithreaded pass."""
        c = self.config
        stride, dilation = _pair(c.stride), _pair(c.dilation)
        _, kh, kw, _ = self.weight.shape
        padding, output_padding = _pair(c.padding), _pair(c.output_padding)
        if stride == (kh, kw) and dilation == (1, 1):
            if padding == (0, 0) and output_padding == (0, 0):
                return ops.blocks_to_image(self.blocks(x, activation=activation), (kh, kw))
            y = ops.blocks_to_image(ops.conv_transpose2d_blocks(x, self.weight), (kh, kw))
        else:
            y = _transposed_conv_as_conv(x, self.weight, stride, dilation)
        y = _crop_transposed(y, padding, output_padding)
        return ops.bias_act(y, self.get("bias"), activation)

    def blocks(self, x: mx.array, *, activation: str | None = None) -> mx.array:
        """:meth:`forward` of a transposed conv whose stride is its kernel (no padding,
        dilation 1), in block layout: ``(N, H, W, I)`` → ``(N, H, W, kH * kW * O)``, each input
        pixel's ``kH x kW`` output pixels side by side (``candle_nn.ops.blocks_to_image`` puts
        them in image order). Saves the depth-to-space copy where per-pixel work follows (a
        norm, another such conv)."""
        c = self.config
        _, kh, kw, _ = self.weight.shape
        if (_pair(c.stride), _pair(c.dilation), _pair(c.padding), _pair(c.output_padding)) \
                != ((kh, kw), (1, 1), (0, 0), (0, 0)):
            raise ValueError(f"ConvTranspose2d.blocks: a {kh}x{kw} transposed conv of stride "
                             f"{c.stride}, padding {c.padding}, output padding "
                             f"{c.output_padding} and dilation {c.dilation} writes no disjoint "
                             "blocks (it needs stride = kernel, no padding, dilation 1)")
        return ops.conv_transpose2d_blocks(x, self.weight, self.get("bias"), activation)


# MLX's own conv_transpose2d is not used: MLX 0.32's CUDA backend computes strided cases with
# overlapping taps wrongly (measured on an H100: k3/s2 up to 1.8 relative error against its CPU
# result). Stride == kernel is ops.conv_transpose2d_blocks (a matmul, ~50x faster than a transposed
# conv on MLX's CPU backend); the formulation below uses only conv2d. Both are right on every
# backend.
def _transposed_conv_as_conv(x: mx.array, weight: mx.array, stride: tuple[int, int],
                             dilation: tuple[int, int]) -> mx.array:
    """The unpadded ("full") transposed convolution as a correlation of the zero-upsampled input
    with the spatially flipped kernel. ``(N, H, W, I)`` → ``(N, (H-1)s + d(k-1) + 1, …, O)``."""
    n, h, w, c = x.shape
    (sh, sw), (dh, dw) = stride, dilation
    _, kh, kw, _ = weight.shape
    if sh > 1 or sw > 1:  # insert s-1 zeros between input pixels
        x = mx.pad(x[:, :, None, :, None, :], [(0, 0), (0, 0), (0, sh - 1), (0, 0), (0, sw - 1),
                                               (0, 0)])
        x = x.reshape(n, h * sh, w * sw, c)[:, :(h - 1) * sh + 1, :(w - 1) * sw + 1, :]
    ph, pw = dh * (kh - 1), dw * (kw - 1)
    x = mx.pad(x, [(0, 0), (ph, ph), (pw, pw), (0, 0)])
    return mx.conv2d(x, weight[:, ::-1, ::-1, :], dilation=(dh, dw))


def _crop_transposed(y: mx.array, padding: tuple[int, int],
                     output_padding: tuple[int, int]) -> mx.array:
    """Apply PyTorch's ``padding`` (crop both sides) and ``output_padding`` (extra rows/columns at
    the end, which receive no input: zeros before the bias) to a full transposed-conv result."""
    (ph, pw), (oh, ow) = padding, output_padding
    if not (ph or pw or oh or ow):
        return y
    full_h, full_w = y.shape[1], y.shape[2]
    extra_h, extra_w = max(oh - ph, 0), max(ow - pw, 0)
    if extra_h or extra_w:
        y = mx.pad(y, [(0, 0), (0, extra_h), (0, extra_w), (0, 0)])
    return y[:, ph:full_h - ph + oh, pw:full_w - pw + ow, :]
