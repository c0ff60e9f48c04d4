"""SAM's original ViT image encoder (``image_encoder.*`` of ViT-B/L/H checkpoints), NHWC.

Input ``(B, 1024, 1024, 3)`` → ``(B, 64, 64, 256)``: a 16x16 patch embedding plus an absolute
position embedding, transformer blocks with windowed (14x14) or global attention and decomposed
relative position biases, and the same conv/LayerNorm2d neck as TinyViT. As candle's
``image_encoder.rs`` (which follows ``segment_anything/modeling/image_encoder.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import candle_nn as cn
from candle_nn import Conv2d, Conv2dConfig, LayerNorm, Linear, Module, VarBuilder
import mlx.core as mx
import numpy as np

from .neck import Neck
from .transformer import MlpBlock


@dataclass(frozen=True)
class ViTConfig:
    """Sizes of a SAM ViT encoder. ``window_size`` applies to blocks not in
    ``global_attn_indexes``; those attend over the whole ``img_size / patch_size`` grid."""

    embed_dim: int
    depth: int
    num_heads: int
    global_attn_indexes: tuple[int, ...]
    img_size: int = 1024
    patch_size: int = 16
    window_size: int = 14
    out_chans: int = 256


VIT_CONFIGS: dict[str, ViTConfig] = {
    "vit_b": ViTConfig(embed_dim=768, depth=12, num_heads=12, global_attn_indexes=(2, 5, 8, 11)),
    "vit_l": ViTConfig(embed_dim=1024, depth=24, num_heads=16,
                       global_attn_indexes=(5, 11, 17, 23)),
    "vit_h": ViTConfig(embed_dim=1280, depth=32, num_heads=16,
                       global_attn_indexes=(7, 15, 23, 31)),
}


def relative_position_index(q_size: int, k_size: int) -> np.ndarray:
    """Rows of the relative-position table used for each (query, key) pair: ``(q_size, k_size)``.

    SAM's ``get_rel_pos``: ``q * max(k/q, 1) - k * max(q/k, 1) + (k_size - 1) * max(q/k, 1)``.
    """
    q = np.arange(q_size)[:, None] * max(k_size / q_size, 1.0)
    k = np.arange(k_size)[None, :] * max(q_size / k_size, 1.0)
    return (q - k + (k_size - 1) * max(q_size / k_size, 1.0)).astype(np.int32)


def resize_rel_pos(rel_pos: mx.array, length: int) -> mx.array:
    """Linearly interpolate a ``(L, C)`` table to ``(length, C)`` (PyTorch ``mode="linear"``)."""
    if rel_pos.shape[0] == length:
        return rel_pos
    table = cn.upsample_bilinear2d(rel_pos[None, :, None, :], length, 1)
    return table[0, :, 0, :]


class ViTAttention(Module):
    """Multi-head attention over an ``(B, H, W, dim)`` grid with decomposed relative positions.

    Tensors: ``qkv`` (``dim → 3 dim``, q/k/v each split into heads), ``proj``, and
    ``rel_pos_h`` / ``rel_pos_w`` ``(2 * size - 1, head_dim)`` for the ``input_size`` grid
    (``rel_pos=None``: no relative positions).
    """

    def __init__(self, qkv: Linear, proj: Linear, num_heads: int,
                 rel_pos: tuple[mx.array, mx.array] | None = None) -> None:
        super().__init__(qkv.device)
        self.num_heads = num_heads
        self.head_dim = proj.out_features // num_heads
        self.qkv, self.proj = qkv, proj
        self.use_rel_pos = rel_pos is not None
        if rel_pos is not None:
            self.rel_pos_h, self.rel_pos_w = rel_pos

    @classmethod
    def load(cls, vb: VarBuilder, dim: int, num_heads: int, input_size: tuple[int, int],
             qkv_bias: bool = True, use_rel_pos: bool = True) -> "ViTAttention":
        qkv = Linear.load(vb.pp("qkv"), dim, 3 * dim, bias=qkv_bias)
        proj, rel_pos = Linear.load(vb.pp("proj"), dim, dim), None
        if use_rel_pos:
            (h, w), head_dim, zero = input_size, dim // num_heads, cn.Init.const(0.0)
            rel_pos = (vb.get((2 * h - 1, head_dim), "rel_pos_h", zero),
                       vb.get((2 * w - 1, head_dim), "rel_pos_w", zero))
        return cls(qkv, proj, num_heads, rel_pos)

    def rel_pos_bias(self, q: mx.array, h: int, w: int) -> mx.array:
        """``(B, heads, h*w, h*w)`` additive bias from unscaled queries ``(B, heads, h*w, hd)``."""
        table_h = resize_rel_pos(self.rel_pos_h, 2 * h - 1)
        table_w = resize_rel_pos(self.rel_pos_w, 2 * w - 1)
        r_h = mx.take(table_h, mx.array(relative_position_index(h, h)), axis=0)  # (h, h, hd)
        r_w = mx.take(table_w, mx.array(relative_position_index(w, w)), axis=0)  # (w, w, hd)
        b, heads, n, hd = q.shape
        r_q = q.reshape(b * heads, h, w, hd)
        rel_h = mx.einsum("bhwc,hkc->bhwk", r_q, r_h)
        rel_w = mx.einsum("bhwc,wkc->bhwk", r_q, r_w)
        bias = rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]  # (b*heads, h, w, kh, kw)
        return bias.reshape(b, heads, n, n)

    def forward(self, x: mx.array) -> mx.array:
        b, h, w, c = x.shape
        qkv = self.qkv(x.reshape(b, h * w, c)).reshape(b, h * w, 3, self.num_heads, self.head_dim)
        q, k, v = (t.squeeze(0) for t in mx.split(qkv.transpose(2, 0, 3, 1, 4), 3, axis=0))
        bias = self.rel_pos_bias(q, h, w) if self.use_rel_pos else None
        out = cn.scaled_dot_product_attention(q, k, v, scale=self.head_dim ** -0.5, mask=bias)
        return self.proj(out.transpose(0, 2, 1, 3).reshape(b, h, w, c))


def window_partition(x: mx.array, window: int) -> tuple[mx.array, tuple[int, int]]:
    """Zero-pad ``(B, H, W, C)`` to whole windows → ``(B * nH * nW, window, window, C)`` and the
    padded ``(Hp, Wp)``."""
    b, h, w, c = x.shape
    pad_h, pad_w = -h % window, -w % window
    if pad_h or pad_w:
        x = mx.pad(x, [(0, 0), (0, pad_h), (0, pad_w), (0, 0)])
    hp, wp = h + pad_h, w + pad_w
    x = x.reshape(b, hp // window, window, wp // window, window, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window, window, c), (hp, wp)


def window_unpartition(windows: mx.array, window: int, padded: tuple[int, int],
                       size: tuple[int, int]) -> mx.array:
    """Inverse of :func:`window_partition`, cropping the padding: → ``(B, H, W, C)``."""
    (hp, wp), (h, w) = padded, size
    c = windows.shape[-1]
    x = windows.reshape(-1, hp // window, wp // window, window, window, c)
    x = x.transpose(0, 1, 3, 2, 4, 5).reshape(-1, hp, wp, c)
    return x[:, :h, :w, :]


class ViTBlock(Module):
    """Pre-norm transformer block (LayerNorm eps 1e-6), windowed when ``window_size > 0``."""

    def __init__(self, norm1: LayerNorm, attn: ViTAttention, norm2: LayerNorm, mlp: MlpBlock,
                 window_size: int) -> None:
        super().__init__(attn.device)
        self.window_size = window_size
        self.norm1, self.attn, self.norm2, self.mlp = norm1, attn, norm2, mlp

    @classmethod
    def load(cls, vb: VarBuilder, dim: int, num_heads: int, window_size: int,
             grid: tuple[int, int]) -> "ViTBlock":
        """``window_size`` 0: global attention over the whole ``grid``."""
        attn_size = (window_size, window_size) if window_size > 0 else grid
        return cls(LayerNorm.load(vb.pp("norm1"), dim, 1e-6),
                   ViTAttention.load(vb.pp("attn"), dim, num_heads, attn_size),
                   LayerNorm.load(vb.pp("norm2"), dim, 1e-6),
                   MlpBlock.load(vb.pp("mlp"), dim, 4 * dim, activation="gelu"), window_size)

    def forward(self, x: mx.array) -> mx.array:
        y = self.norm1(x)
        if self.window_size > 0:
            size = (y.shape[1], y.shape[2])
            windows, padded = window_partition(y, self.window_size)
            y = window_unpartition(self.attn(windows), self.window_size, padded, size)
        else:
            y = self.attn(y)
        x = x + y
        return x + self.mlp(self.norm2(x))


class ImageEncoderViT(Module):
    """SAM's ViT encoder: ``(B, img, img, 3)`` → ``(B, img/16, img/16, out_chans)``.

    Args:
        patch_embed: the ``patch_size`` x ``patch_size``, stride ``patch_size`` conv.
        pos_embed: ``(1, img/16, img/16, embed_dim)`` absolute position embedding.
        blocks: the transformer blocks.
        neck: the conv/LayerNorm2d neck (:class:`Neck`).
    """

    def __init__(self, patch_embed: Conv2d, pos_embed: mx.array, blocks: list[ViTBlock],
                 neck: Neck) -> None:
        super().__init__(patch_embed.device)
        self.patch_embed = patch_embed
        self.pos_embed = pos_embed
        self.blocks = blocks
        self.neck = neck

    @classmethod
    def load(cls, vb: VarBuilder, variant: "str | ViTConfig" = "vit_b") -> "ImageEncoderViT":
        """``variant``: a key of ``VIT_CONFIGS`` or a :class:`ViTConfig`."""
        if isinstance(variant, str):
            if variant not in VIT_CONFIGS:
                raise ValueError(f"unknown SAM ViT variant {variant!r}; "
                                 f"choose one of {sorted(VIT_CONFIGS)}")
            variant = VIT_CONFIGS[variant]
        c, blocks = variant, vb.pp("blocks")
        grid = c.img_size // c.patch_size
        encoder = cls(Conv2d.load(vb.pp("patch_embed.proj"), 3, c.embed_dim, c.patch_size,
                               Conv2dConfig(stride=c.patch_size)),
                   vb.get((1, grid, grid, c.embed_dim), "pos_embed", cn.Init.const(0.0)),
                   [ViTBlock.load(blocks.pp(i), c.embed_dim, c.num_heads,
                                  0 if i in c.global_attn_indexes else c.window_size, (grid, grid))
                    for i in range(c.depth)],
                   Neck.load(vb.pp("neck"), c.embed_dim, c.out_chans))
        vb.check_all_read(f"the SAM ViT encoder ({c.embed_dim} wide, {c.depth} blocks)")
        return encoder

    def forward(self, x: mx.array) -> mx.array:
        x = self.patch_embed(x) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.neck(x)
