"""A convolution followed by a BatchNorm, folded into one conv for inference or kept for training.

Models call :meth:`ConvBn.load` and get one of two layers with the same call signature
``layer(x, activation=..., residual=..., residual_after_activation=...)``:

* ``fold_bn=True`` (inference, the default): a :class:`Conv2d` with the BatchNorm absorbed
  (``Conv2d.load_with_bn``), whose bias, activation and residual run as the conv's fused epilogue.
* ``fold_bn=False`` (training): a :class:`ConvBn` holding the conv and a :class:`BatchNorm2d`
  that follows ``train()`` / ``eval()``.

Both read and write the checkpoint under the conv's and the BatchNorm's own names
(``<conv>.weight``, ``<bn>.running_mean`` …), so a trained ``ConvBn`` model's file reloads folded.
"""

from __future__ import annotations

import mlx.core as mx

from .activation import bias_act
from .batch_norm import BatchNorm2d
from .conv import Conv2d, Conv2dConfig
from .module import Module, check_same_device
from .var_builder import VarBuilder


class ConvBn(Module):
    """``activation(bn(conv(x)) [+ residual])``: a bias-free :class:`Conv2d` and its
    :class:`BatchNorm2d`, unfolded (for training).

    Input ``(N, H, W, in_channels)`` → ``(N, H', W', out_channels)``.
    """

    def __init__(self, conv: Conv2d, bn: BatchNorm2d) -> None:
        check_same_device("ConvBn", conv.device, bn.device, "the Conv2d", "the BatchNorm2d")
        super().__init__(conv.device)
        self.conv = conv
        self.bn = bn

    @property
    def weight(self) -> mx.array:
        """The convolution's weight ``(O, kH, kW, I/groups)`` (MLX layout)."""
        return self.conv.weight

    @property
    def out_channels(self) -> int:
        return self.conv.out_channels

    def forward(self, x: mx.array, *, activation: str | None = None,
                residual: mx.array | None = None,
                residual_after_activation: bool = False) -> mx.array:
        """As :meth:`Conv2d.forward`, with the BatchNorm between the conv and the epilogue."""
        return bias_act(self.bn(self.conv(x)), None, activation, residual,
                        residual_after_activation=residual_after_activation)

    @classmethod
    def load(cls, vb: VarBuilder, in_channels: int, out_channels: int,
             kernel_size: "int | tuple[int, int]", config: Conv2dConfig = Conv2dConfig(), *,
             conv: str = "conv", bn: str = "bn", eps: float = 1e-5, momentum: float = 0.1,
             fold_bn: bool = True) -> "Conv2d | ConvBn":
        """A conv without bias at ``vb.pp(conv)`` and its BatchNorm at ``vb.pp(bn)`` (``eps``,
        ``momentum``): a ConvBn (``fold_bn=False``, to train), or, by default, one
        :class:`Conv2d` with the BatchNorm folded in (``Conv2d.load_with_bn``, inference)."""
        if fold_bn:
            return Conv2d.load_with_bn(vb, in_channels, out_channels, kernel_size, config,
                                       conv=conv, bn=bn, eps=eps)
        layer = Conv2d.load(vb.pp(conv), in_channels, out_channels, kernel_size, config,
                            bias=False)
        return cls(layer, BatchNorm2d.load(vb.pp(bn), out_channels, eps, momentum))

    def fold(self) -> Conv2d:
        """The inference layer: a new Conv2d with the BatchNorm's running statistics absorbed
        (what ``ConvBn.load(..., fold_bn=True)`` builds from a saved checkpoint)."""
        return self.conv.absorb_bn(self.bn)

