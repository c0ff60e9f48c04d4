"""SAM's original ViT image encoder (``image_encoder.*`` of ViT-B/L/H checkpoints), NHWC.

Input ``(B, 1024, 1024, 3)`` → ``(B, 64, 64, 256)``: a 16x16 patch embedding plus an absolute
position embedding, transformer blocks with windowed (14x14) or global attention and decomposed
relative position biases, and the same conv/LayerNorm2d neck as TinyViT. As candle's
``image_encoder.rs`` (which follows ``segment_anything/modeling/image_encoder.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import candle_nn as cn
from candle_nn import Conv2d, Conv2dConfig, LayerNorm, LayerNorm2d, Linear, Module, VarBuilder
import mlx.core as mx
import numpy as np

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
    ``rel_pos_h`` / ``rel_pos_w`` ``(2 * size - 1, head_dim)`` for the ``input_size`` grid.
    """

    def __init__(self, vb: VarBuilder, dim: int, num_heads: int, input_size: tuple[int, int],
                 qkv_bias: bool = True, use_rel_pos: bool = True) -> None:
        super().__init__(vb.device)
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = Linear.load(vb.pp("qkv"), dim, 3 * dim, bias=qkv_bias)
        self.proj = Linear.load(vb.pp("proj"), dim, dim)
        self.use_rel_pos = use_rel_pos
        if use_rel_pos:
            h, w = input_size
            self.rel_pos_h = vb.get((2 * h - 1, self.head_dim), "rel_pos_h", cn.Init.const(0.0))
            self.rel_pos_w = vb.get((2 * w - 1, self.head_dim), "rel_pos_w", cn.Init.const(0.0))

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

    def __init__(self, vb: VarBuilder, dim: int, num_heads: int, window_size: int,
                 grid: tuple[int, int]) -> None:
        super().__init__(vb.device)
        self.window_size = window_size
        self.norm1 = LayerNorm.load(vb.pp("norm1"), dim, 1e-6)
        attn_size = (window_size, window_size) if window_size > 0 else grid
        self.attn = ViTAttention(vb.pp("attn"), dim, num_heads, attn_size)
        self.norm2 = LayerNorm.load(vb.pp("norm2"), dim, 1e-6)
        self.mlp = MlpBlock(vb.pp("mlp"), dim, 4 * dim, activation="gelu")

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
    """SAM's ViT encoder: ``(B, img, img, 3)`` → ``(B, img/16, img/16, out_chans)``."""

    def __init__(self, vb: VarBuilder, config: ViTConfig) -> None:
        super().__init__(vb.device)
        c = config
        grid = c.img_size // c.patch_size
        self.patch_embed = Conv2d.load(vb.pp("patch_embed.proj"), 3, c.embed_dim, c.patch_size,
                                       Conv2dConfig(stride=c.patch_size))
        self.pos_embed = vb.get((1, grid, grid, c.embed_dim), "pos_embed", cn.Init.const(0.0))
        self.blocks = [ViTBlock(vb.pp("blocks").pp(i), c.embed_dim, c.num_heads,
                                0 if i in c.global_attn_indexes else c.window_size, (grid, grid))
                       for i in range(c.depth)]
        self.neck_conv1 = Conv2d.load(vb.pp("neck.0"), c.embed_dim, c.out_chans, 1, bias=False)
        self.neck_ln1 = LayerNorm2d.load(vb.pp("neck.1"), c.out_chans)
        self.neck_conv2 = Conv2d.load(vb.pp("neck.2"), c.out_chans, c.out_chans, 3,
                                      Conv2dConfig(padding=1), bias=False)
        self.neck_ln2 = LayerNorm2d.load(vb.pp("neck.3"), c.out_chans)

    @classmethod
    def load(cls, vb: VarBuilder, variant: "str | ViTConfig" = "vit_b") -> "ImageEncoderViT":
        """``variant``: a key of ``VIT_CONFIGS`` or a :class:`ViTConfig`."""
        if isinstance(variant, str):
            if variant not in VIT_CONFIGS:
                raise ValueError(f"unknown SAM ViT variant {variant!r}; "
                                 f"choose one of {sorted(VIT_CONFIGS)}")
            variant = VIT_CONFIGS[variant]
        return cls(vb, variant)

    def forward(self, x: mx.array) -> mx.array:
        x = self.patch_embed(x) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.neck_ln2(self.neck_conv2(self.neck_ln1(self.neck_conv1(x))))
