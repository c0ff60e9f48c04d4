"""YOLO11's building blocks (ultralytics ``C3k``, ``C3k2``, ``Attention``, ``PSABlock``,
``C2PSA``), NHWC, built from YOLOv8's (:mod:`candle_nn_models.yolo_v8_blocks`).

Tensor names are ultralytics' module names (candle has no YOLO11): a :class:`C3k2` holds ``cv1``,
``cv2`` and ``m.K`` (a Bottleneck or a :class:`C3k`); a :class:`C3k` ``cv1``, ``cv2``, ``cv3``
and ``m.K``; a :class:`C2PSA` ``cv1``, ``cv2`` and ``m.K`` (:class:`PSABlock`: ``attn.qkv``,
``attn.proj``, ``attn.pe``, ``ffn.0``, ``ffn.1``). Every convolution is a :class:`ConvBlock`.
"""

from __future__ import annotations

import candle_nn as cn
import mlx.core as mx

from .yolo_v8_blocks import C2f, Bottleneck, ConvBlock


class C3k(cn.Module):
    """CSP bottleneck with three convolutions: ``cv3(concat(m(cv1(x)), cv2(x)))``, ``m`` being
    ``n`` 3×3 Bottlenecks of ``c2 // 2`` channels.

    Input ``(N, H, W, c1)`` → ``(N, H, W, c2)``.
    """

    def __init__(self, cv1: ConvBlock, cv2: ConvBlock, cv3: ConvBlock,
                 m: list[Bottleneck]) -> None:
        super().__init__(cv1.device)
        self.cv1, self.cv2, self.cv3, self.m = cv1, cv2, cv3, m

    @classmethod
    def load(cls, vb: cn.VarBuilder, c1: int, c2: int, n: int = 2, shortcut: bool = True,
             fold_bn: bool = True) -> "C3k":
        c, f = c2 // 2, fold_bn
        return cls(ConvBlock.load(vb.pp("cv1"), c1, c, 1, fold_bn=f),
                   ConvBlock.load(vb.pp("cv2"), c1, c, 1, fold_bn=f),
                   ConvBlock.load(vb.pp("cv3"), 2 * c, c2, 1, fold_bn=f),
                   [Bottleneck.load(vb.pp(f"m.{i}"), c, c, shortcut, f) for i in range(n)])

    def forward(self, x: mx.array) -> mx.array:
        y = self.cv1(x)
        for block in self.m:
            y = block(y)
        return self.cv3(cn.ops.concat_last([y, self.cv2(x)]))


class C3k2(C2f):
    """YOLOv8's :class:`C2f` with YOLO11's inner blocks: ``cv1`` → split into two halves of
    ``int(c2 * e)`` channels → ``n`` blocks (each a :class:`C3k` when ``c3k``, else a
    Bottleneck of expansion 0.5) → concatenate → ``cv2``.

    Input ``(N, H, W, c1)`` → ``(N, H, W, c2)``.
    """

    @classmethod
    def load(cls, vb: cn.VarBuilder, c1: int, c2: int, n: int, c3k: bool = False,
             e: float = 0.5, shortcut: bool = True, fold_bn: bool = True) -> "C3k2":
        c, f = int(c2 * e), fold_bn

        def block(vb: cn.VarBuilder) -> cn.Module:
            if c3k:
                return C3k.load(vb, c, c, 2, shortcut, f)
            return Bottleneck.load(vb, c, c, shortcut, f, e=0.5)

        return cls(ConvBlock.load(vb.pp("cv1"), c1, 2 * c, 1, fold_bn=f),
                   ConvBlock.load(vb.pp("cv2"), (2 + n) * c, c2, 1, fold_bn=f),
                   [block(vb.pp(f"m.{i}")) for i in range(n)])


class Attention(cn.Module):
    """Multi-head self-attention over the ``H × W`` positions, with a positional term.

    ``qkv`` (1×1, no activation) gives per head a query and key of ``key_dim = head_dim / 2`` and
    a value of ``head_dim`` channels (head-major, ultralytics' layout); the output is
    ``proj(attention(q, k, v) + pe(v))``, ``pe`` a depthwise 3×3 ConvBlock without activation.
    Input and output ``(N, H, W, dim)``.
    """

    def __init__(self, qkv: ConvBlock, proj: ConvBlock, pe: ConvBlock, num_heads: int,
                 key_dim: int) -> None:
        super().__init__(qkv.device)
        self.qkv, self.proj, self.pe = qkv, proj, pe
        self.num_heads, self.key_dim = num_heads, key_dim

    @classmethod
    def load(cls, vb: cn.VarBuilder, dim: int, num_heads: int, attn_ratio: float = 0.5,
             fold_bn: bool = True) -> "Attention":
        head_dim = dim // num_heads
        key_dim = int(head_dim * attn_ratio)
        width = dim + 2 * key_dim * num_heads
        f = fold_bn
        return cls(ConvBlock.load(vb.pp("qkv"), dim, width, 1, fold_bn=f, act=False),
                   ConvBlock.load(vb.pp("proj"), dim, dim, 1, fold_bn=f, act=False),
                   ConvBlock.load(vb.pp("pe"), dim, dim, 3, fold_bn=f, groups=dim, act=False),
                   num_heads, key_dim)

    def forward(self, x: mx.array) -> mx.array:
        n, h, w, dim = x.shape
        heads, kd = self.num_heads, self.key_dim
        qkv = self.qkv(x).reshape(n, h * w, heads, -1).transpose(0, 2, 1, 3)
        q, k, v = qkv[..., :kd], qkv[..., kd:2 * kd], qkv[..., 2 * kd:]  # (N, heads, HW, ·)
        out = cn.scaled_dot_product_attention(q, k, v, scale=kd ** -0.5)

        def image(t: mx.array) -> mx.array:  # (N, heads, HW, head_dim) -> (N, H, W, dim)
            return t.transpose(0, 2, 1, 3).reshape(n, h, w, dim)

        return self.proj(image(out) + self.pe(image(v)))


class PSABlock(cn.Module):
    """Position-sensitive attention block: ``x + attn(x)``, then ``x + ffn(x)`` (``ffn``: 1×1
    ConvBlocks ``c → 2c`` with SiLU, ``2c → c`` without). Input and output ``(N, H, W, c)``."""

    def __init__(self, attn: Attention, ffn: list[ConvBlock]) -> None:
        super().__init__(attn.device)
        self.attn, self.ffn = attn, ffn

    @classmethod
    def load(cls, vb: cn.VarBuilder, c: int, num_heads: int, attn_ratio: float = 0.5,
             fold_bn: bool = True) -> "PSABlock":
        return cls(Attention.load(vb.pp("attn"), c, num_heads, attn_ratio, fold_bn),
                   [ConvBlock.load(vb.pp("ffn.0"), c, 2 * c, 1, fold_bn=fold_bn),
                    ConvBlock.load(vb.pp("ffn.1"), 2 * c, c, 1, fold_bn=fold_bn, act=False)])

    def forward(self, x: mx.array) -> mx.array:
        x = x + self.attn(x)
        return self.ffn[1](self.ffn[0](x), residual=x)


class C2PSA(cn.Module):
    """``cv1`` → split into halves ``a, b`` of ``c1 // 2`` channels → ``n`` PSABlocks on ``b``
    (``max(c // 64, 1)`` heads) → ``cv2(concat(a, b))``. Input and output ``(N, H, W, c1)``."""

    def __init__(self, cv1: ConvBlock, cv2: ConvBlock, m: list[PSABlock]) -> None:
        super().__init__(cv1.device)
        self.cv1, self.cv2, self.m = cv1, cv2, m

    @classmethod
    def load(cls, vb: cn.VarBuilder, c1: int, n: int = 1, e: float = 0.5,
             fold_bn: bool = True) -> "C2PSA":
        c, f = int(c1 * e), fold_bn
        return cls(ConvBlock.load(vb.pp("cv1"), c1, 2 * c, 1, fold_bn=f),
                   ConvBlock.load(vb.pp("cv2"), 2 * c, c1, 1, fold_bn=f),
                   [PSABlock.load(vb.pp(f"m.{i}"), c, max(c // 64, 1), 0.5, f)
                    for i in range(n)])

    def forward(self, x: mx.array) -> mx.array:
        a, b = mx.split(self.cv1(x), 2, axis=-1)
        for block in self.m:
            b = block(b)
        return self.cv2(cn.ops.concat_last([a, b]))
