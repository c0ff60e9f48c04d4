"""The neck both SAM image encoders (TinyViT and ViT) end with (``image_encoder.neck.*``), NHWC."""

from __future__ import annotations

from candle_nn import Conv2d, Conv2dConfig, LayerNorm2d, Module, VarBuilder
import mlx.core as mx


class Neck(Module):
    """1x1 conv → LayerNorm2d → 3x3 conv → LayerNorm2d, convs without bias (``neck.0`` …
    ``neck.3``). ``(B, H, W, in_channels)`` → ``(B, H, W, out_channels)``."""

    def __init__(self, conv1: Conv2d, ln1: LayerNorm2d, conv2: Conv2d, ln2: LayerNorm2d) -> None:
        super().__init__(conv1.device)
        self.conv1, self.ln1, self.conv2, self.ln2 = conv1, ln1, conv2, ln2

    @classmethod
    def load(cls, vb: VarBuilder, in_channels: int, out_channels: int) -> "Neck":
        return cls(Conv2d.load(vb.pp(0), in_channels, out_channels, 1, bias=False),
                   LayerNorm2d.load(vb.pp(1), out_channels),
                   Conv2d.load(vb.pp(2), out_channels, out_channels, 3, Conv2dConfig(padding=1),
                               bias=False),
                   LayerNorm2d.load(vb.pp(3), out_channels))

    def forward(self, x: mx.array) -> mx.array:
        return self.ln2(self.conv2(self.ln1(self.conv1(x))))
