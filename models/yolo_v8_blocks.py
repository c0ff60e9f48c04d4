"""YOLOv8's building blocks (ultralytics ``Conv``, ``Bottleneck``, ``C2f``, ``SPPF``), NHWC.

Tensor names follow candle's ``yolo-v8/model.rs``: a :class:`ConvBlock` holds ``conv.weight``
(no bias) and ``bn.*`` (eps 1e-3, folded into the convolution at load); a :class:`C2f` holds
``cv1``, ``cv2`` and ``bottleneck.N``; an :class:`Sppf` holds ``cv1`` and ``cv2``. YOLO11's blocks
(``candle_nn_models.yolo11_blocks``) are built from these with their extra parameters (groups, no
activation, a bottleneck's expansion).
"""

from __future__ import annotations

import candle_nn as cn
import mlx.core as mx

BN_EPS = 1e-3
BN_MOMENTUM = 0.03  # ultralytics' BatchNorm momentum (PyTorch's convention)


class ConvBlock(cn.Module):
    """Conv (no bias) → BatchNorm (eps 1e-3, momentum 0.03; folded at load unless
    ``fold_bn=False``) → SiLU (none when ``act=False``: ultralytics' ``Conv(..., act=False)``).

    Input ``(N, H, W, c1)`` → ``(N, H / stride, W / stride, c2)`` (padding ``k // 2``);
    ``groups``: grouped convolution (``groups == c1 == c2``: ultralytics' depthwise ``DWConv``).
    """

    def __init__(self, conv: "cn.Conv2d | cn.ConvBn", act: bool = True) -> None:
        super().__init__(conv.device)
        self.conv = conv
        self.activation = "silu" if act else None

    @classmethod
    def load(cls, vb: cn.VarBuilder, c1: int, c2: int, k: int, stride: int = 1,
             fold_bn: bool = True, *, groups: int = 1, act: bool = True) -> "ConvBlock":
        config = cn.Conv2dConfig(padding=k // 2, stride=stride, groups=groups)
        return cls(cn.ConvBn.load(vb, c1, c2, k, config, eps=BN_EPS, momentum=BN_MOMENTUM,
                                  fold_bn=fold_bn), act)

    def forward(self, x: mx.array, residual: mx.array | None = None) -> mx.array:
        """``silu(conv(x))`` (``conv(x)`` when built with ``act=False``), plus ``residual`` when
        given (one fused pass on the CPU)."""
        return self.conv(x, activation=self.activation, residual=residual,
                         residual_after_activation=True)


class Bottleneck(cn.Module):
    """Two 3×3 ConvBlocks ``c1 → int(c2 * e) → c2``, with a residual connection when
    ``shortcut`` and ``c1 == c2`` (YOLOv8's C2f uses ``e=1``, YOLO11's C3k2 ultralytics' default
    ``e=0.5``)."""

    def __init__(self, cv1: ConvBlock, cv2: ConvBlock, residual: bool) -> None:
        super().__init__(cv1.device)
        self.cv1, self.cv2 = cv1, cv2
        self.residual = residual

    @classmethod
    def load(cls, vb: cn.VarBuilder, c1: int, c2: int, shortcut: bool,
             fold_bn: bool = True, e: float = 1.0) -> "Bottleneck":
        c = int(c2 * e)
        return cls(ConvBlock.load(vb.pp("cv1"), c1, c, 3, fold_bn=fold_bn),
                   ConvBlock.load(vb.pp("cv2"), c, c2, 3, fold_bn=fold_bn), shortcut and c1 == c2)

    def forward(self, x: mx.array) -> mx.array:
        return self.cv2(self.cv1(x), residual=x if self.residual else None)


class C2f(cn.Module):
    """CSP bottleneck with two convolutions: ``cv1`` → split in halves → ``n`` bottlenecks, each
    fed the previous output → concatenate every piece → ``cv2``.

    Input ``(N, H, W, c1)`` → ``(N, H, W, c2)``.
    """

    def __init__(self, cv1: ConvBlock, cv2: ConvBlock, bottleneck: list[cn.Module]) -> None:
        super().__init__(cv1.device)
        self.cv1, self.cv2 = cv1, cv2
        self.bottleneck = bottleneck

    @classmethod
    def load(cls, vb: cn.VarBuilder, c1: int, c2: int, n: int, shortcut: bool,
             fold_bn: bool = True) -> "C2f":
        c, f = c2 // 2, fold_bn
        return cls(ConvBlock.load(vb.pp("cv1"), c1, 2 * c, 1, fold_bn=f),
                   ConvBlock.load(vb.pp("cv2"), (2 + n) * c, c2, 1, fold_bn=f),
                   [Bottleneck.load(vb.pp(f"bottleneck.{i}"), c, c, shortcut, f)
                    for i in range(n)])

    def forward(self, x: mx.array) -> mx.array:
        ys = mx.split(self.cv1(x), 2, axis=-1)
        for block in self.bottleneck:
            ys.append(block(ys[-1]))
        return self.cv2(cn.ops.concat_last(ys))


class Sppf(cn.Module):
    """Spatial pyramid pooling, fast: ``cv1``, three chained 5×5 stride-1 max pools, ``cv2`` on
    the concatenation of the four.

    The pools pad with -inf, as ultralytics' ``nn.MaxPool2d(k, 1, k // 2)`` (candle pads with
    zeros, which differs where a whole window of the SiLU output is negative).
    """

    def __init__(self, cv1: ConvBlock, cv2: ConvBlock, k: int = 5) -> None:
        super().__init__(cv1.device)
        self.cv1, self.cv2 = cv1, cv2
        self.k = k

    @classmethod
    def load(cls, vb: cn.VarBuilder, c1: int, c2: int, k: int = 5,
             fold_bn: bool = True) -> "Sppf":
        c = c1 // 2
        return cls(ConvBlock.load(vb.pp("cv1"), c1, c, 1, fold_bn=fold_bn),
                   ConvBlock.load(vb.pp("cv2"), 4 * c, c2, 1, fold_bn=fold_bn), k)

    def forward(self, x: mx.array) -> mx.array:
        ys = [self.cv1(x)]
        for _ in range(3):
            ys.append(cn.max_pool2d(ys[-1], self.k, 1, self.k // 2))
        return self.cv2(cn.ops.concat_last(ys))
