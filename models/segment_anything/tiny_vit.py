"""TinyViT image encoder of MobileSAM (``image_encoder.*``), NHWC throughout.

Input ``(B, 1024, 1024, 3)`` normalised pixels → image embeddings ``(B, 64, 64, 256)``.

Structure (MobileSAM's ``tiny_vit_sam.py``, candle's ``tiny_vit.rs``): a stride-4 conv stem,
one MBConv stage, three stages of windowed attention blocks (attention + a depthwise "local"
conv + an MLP), patch merging between stages, and a neck of two convolutions with LayerNorm2d.
Every Conv2d+BatchNorm pair (``*.c`` / ``*.bn``) is folded into one convolution at load.
"""

from __future__ import annotations

from dataclasses import dataclass

import candle_nn as cn
from candle_nn import Conv2d, Conv2dConfig, LayerNorm, LayerNorm2d, Linear, Module, VarBuilder
import mlx.core as mx
import numpy as np


MBCONV_EXPAND_RATIO = 4
MLP_RATIO = 4
LOCAL_CONV_SIZE = 3
IMAGE_SIZE = 1024
IN_CHANNELS = 3
NECK_CHANNELS = 256


@dataclass(frozen=True)
class TinyViTConfig:
    """Per-stage widths, depths, heads and attention window sizes (stage 0 is the MBConv stage)."""

    embed_dims: tuple[int, ...]
    depths: tuple[int, ...]
    num_heads: tuple[int, ...]
    window_sizes: tuple[int, ...]


TINY_VIT_CONFIGS: dict[str, TinyViTConfig] = {
    "5m": TinyViTConfig(embed_dims=(64, 128, 160, 320), depths=(2, 2, 6, 2),
                        num_heads=(2, 4, 5, 10), window_sizes=(7, 7, 14, 7)),
}


def conv2d_bn(vb: VarBuilder, in_channels: int, out_channels: int, kernel_size: int,
              config: Conv2dConfig = Conv2dConfig()) -> Conv2d:
    """MobileSAM's ``Conv2d_BN``: ``c`` (no bias) then ``bn`` (eps 1e-5), folded into one Conv2d."""
    conv = Conv2d.load(vb.pp("c"), in_channels, out_channels, kernel_size, config, bias=False)
    return conv.fold_batch_norm(cn.BatchNorm2d.load(vb.pp("bn"), out_channels, 1e-5))


class PatchEmbed(Module):
    """Two stride-2 3x3 conv-BN with a GELU between: ``(B, H, W, 3)`` → ``(B, H/4, W/4, dim)``."""

    def __init__(self, vb: VarBuilder, in_channels: int, embed_dim: int) -> None:
        super().__init__(vb.device)
        cfg = Conv2dConfig(stride=2, padding=1)
        self.conv1 = conv2d_bn(vb.pp("seq.0"), in_channels, embed_dim // 2, 3, cfg)
        self.conv2 = conv2d_bn(vb.pp("seq.2"), embed_dim // 2, embed_dim, 3, cfg)

    def forward(self, x: mx.array) -> mx.array:
        return self.conv2(self.conv1(x, activation="gelu"))


class MBConv(Module):
    """Inverted residual: 1x1 expand, 3x3 depthwise, 1x1 project, residual, GELU. Shape kept."""

    def __init__(self, vb: VarBuilder, dim: int, expand_ratio: int = MBCONV_EXPAND_RATIO) -> None:
        super().__init__(vb.device)
        hidden = dim * expand_ratio
        self.conv1 = conv2d_bn(vb.pp("conv1"), dim, hidden, 1)
        self.conv2 = conv2d_bn(vb.pp("conv2"), hidden, hidden, 3,
                               Conv2dConfig(padding=1, groups=hidden))
        self.conv3 = conv2d_bn(vb.pp("conv3"), hidden, dim, 1)

    def forward(self, x: mx.array) -> mx.array:
        y = self.conv2(self.conv1(x, activation="gelu"), activation="gelu")
        return self.conv3(y, activation="gelu", residual=x)


class PatchMerging(Module):
    """1x1 conv, 3x3 depthwise conv (stride 2, or 1 for the widest stages), 1x1 conv.

    ``(B, H, W, dim)`` → ``(B, H/stride, W/stride, out)``.
    """

    def __init__(self, vb: VarBuilder, dim: int, out: int) -> None:
        super().__init__(vb.device)
        stride = 1 if out in (320, 448, 576) else 2  # MobileSAM keeps 64x64 for the last stage
        self.conv1 = conv2d_bn(vb.pp("conv1"), dim, out, 1)
        self.conv2 = conv2d_bn(vb.pp("conv2"), out, out, 3,
                               Conv2dConfig(padding=1, stride=stride, groups=out))
        self.conv3 = conv2d_bn(vb.pp("conv3"), out, out, 1)

    def forward(self, x: mx.array) -> mx.array:
        return self.conv3(self.conv2(self.conv1(x, activation="gelu"), activation="gelu"))


class ConvLayer(Module):
    """Stage 0: ``depth`` MBConv blocks then patch merging to ``out`` channels."""

    def __init__(self, vb: VarBuilder, dim: int, out: int, depth: int) -> None:
        super().__init__(vb.device)
        self.blocks = [MBConv(vb.pp("blocks").pp(i), dim) for i in range(depth)]
        self.downsample = PatchMerging(vb.pp("downsample"), dim, out)

    def forward(self, x: mx.array) -> mx.array:
        for block in self.blocks:
            x = block(x)
        return self.downsample(x)


class Mlp(Module):
    """Pre-norm MLP: LayerNorm, fc1, GELU, fc2. ``(..., dim)`` → ``(..., dim)``."""

    def __init__(self, vb: VarBuilder, dim: int, hidden: int) -> None:
        super().__init__(vb.device)
        self.norm = LayerNorm.load(vb.pp("norm"), dim, 1e-5)
        self.fc1 = Linear.load(vb.pp("fc1"), dim, hidden)
        self.fc2 = Linear.load(vb.pp("fc2"), hidden, dim)

    def forward(self, x: mx.array) -> mx.array:
        return self.fc2(self.fc1(self.norm(x), activation="gelu"))


def attention_bias_index(window: int) -> np.ndarray:
    """The offset-index table of TinyViT's attention biases: ``(window², window²)`` int32.

    Entry ``[i, j]`` numbers the offset ``(|dy|, |dx|)`` between window positions ``i`` and ``j``
    (row-major), in order of first appearance: the column of ``attention_biases`` to use.
    """
    ys, xs = np.divmod(np.arange(window * window), window)
    dy = np.abs(ys[:, None] - ys[None, :])
    dx = np.abs(xs[:, None] - xs[None, :])
    offsets = (dy * window + dx).ravel()
    _, first, inverse = np.unique(offsets, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))  # unique offsets renumbered by first appearance
    return rank[inverse].reshape(window * window, window * window).astype(np.int32)


class WindowAttention(Module):
    """Multi-head self-attention inside one window, with a learned bias per head and offset.

    Input ``(B, N, dim)`` with ``N = window²`` tokens → ``(B, N, dim)``. Tensors: ``norm``,
    ``qkv`` (per head: q, k, v of ``dim / heads`` each), ``proj``, ``attention_biases``
    ``(heads, num_offsets)``. The biases are gathered into ``(heads, N, N)`` on every call, so a
    change to ``attention_biases`` always takes effect.
    """

    def __init__(self, vb: VarBuilder, dim: int, num_heads: int, window: int) -> None:
        super().__init__(vb.device)
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.norm = LayerNorm.load(vb.pp("norm"), dim, 1e-5)
        self.qkv = Linear.load(vb.pp("qkv"), dim, 3 * dim)
        self.proj = Linear.load(vb.pp("proj"), dim, dim)
        index = attention_bias_index(window)
        self.attention_biases = vb.get((num_heads, int(index.max()) + 1), "attention_biases")
        self._bias_index = mx.array(index)  # "_": not a parameter

    def forward(self, x: mx.array) -> mx.array:
        b, n, _ = x.shape
        qkv = self.qkv(self.norm(x)).reshape(b, n, self.num_heads, 3 * self.head_dim)
        qkv = qkv.transpose(0, 2, 1, 3)
        q, k, v = mx.split(qkv, 3, axis=-1)
        bias = mx.take(self.attention_biases, self._bias_index, axis=1)[None]  # (1, heads, N, N)
        out = cn.scaled_dot_product_attention(q, k, v, scale=self.head_dim ** -0.5, mask=bias)
        return self.proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


def window_partition(x: mx.array, window: int) -> mx.array:
    """``(B, H, W, C)`` with H, W multiples of ``window`` → ``(B * nH * nW, window², C)``."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // window, window, w // window, window, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window * window, c)


def window_merge(x: mx.array, batch: int, height: int, width: int, window: int) -> mx.array:
    """Inverse of :func:`window_partition`: → ``(batch, height, width, C)``."""
    c = x.shape[-1]
    x = x.reshape(batch, height // window, width // window, window, window, c)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(batch, height, width, c)


class TinyViTBlock(Module):
    """Windowed attention (zero-padded to whole windows), residual; depthwise 3x3 local conv;
    MLP, residual. ``(B, H, W, dim)`` → same shape."""

    def __init__(self, vb: VarBuilder, dim: int, num_heads: int, window: int) -> None:
        super().__init__(vb.device)
        self.window = window
        self.attn = WindowAttention(vb.pp("attn"), dim, num_heads, window)
        self.local_conv = conv2d_bn(vb.pp("local_conv"), dim, dim, LOCAL_CONV_SIZE,
                                    Conv2dConfig(padding=LOCAL_CONV_SIZE // 2, groups=dim))
        self.mlp = Mlp(vb.pp("mlp"), dim, dim * MLP_RATIO)

    def forward(self, x: mx.array) -> mx.array:
        b, h, w, c = x.shape
        ws = self.window
        pad_b, pad_r = -h % ws, -w % ws
        y = mx.pad(x, [(0, 0), (0, pad_b), (0, pad_r), (0, 0)]) if pad_b or pad_r else x
        y = window_merge(self.attn(window_partition(y, ws)), b, h + pad_b, w + pad_r, ws)
        x = x + y[:, :h, :w, :]
        x = self.local_conv(x)
        return x + self.mlp(x)


class BasicLayer(Module):
    """A stage of TinyViT blocks, then (except for the last stage) patch merging to ``out``."""

    def __init__(self, vb: VarBuilder, dim: int, depth: int, num_heads: int, window: int,
                 out: int | None) -> None:
        super().__init__(vb.device)
        self.blocks = [TinyViTBlock(vb.pp("blocks").pp(i), dim, num_heads, window)
                       for i in range(depth)]
        if out is not None:
            self.downsample = PatchMerging(vb.pp("downsample"), dim, out)

    def forward(self, x: mx.array) -> mx.array:
        for block in self.blocks:
            x = block(x)
        return self.downsample(x) if "downsample" in self else x


class TinyViT(Module):
    """MobileSAM's TinyViT image encoder (classification head unused).

    ``(B, 1024, 1024, 3)`` → ``(B, 64, 64, 256)``. Load with :meth:`load` or
    :func:`tiny_vit_5m` under the ``image_encoder`` prefix.
    """

    def __init__(self, vb: VarBuilder, config: TinyViTConfig) -> None:
        super().__init__(vb.device)
        dims = config.embed_dims
        self.patch_embed = PatchEmbed(vb.pp("patch_embed"), IN_CHANNELS, dims[0])
        layers: list[Module] = [ConvLayer(vb.pp("layers.0"), dims[0], dims[1], config.depths[0])]
        for i in range(1, len(dims)):
            out = dims[i + 1] if i + 1 < len(dims) else None
            layers.append(BasicLayer(vb.pp("layers").pp(i), dims[i], config.depths[i],
                                     config.num_heads[i], config.window_sizes[i], out))
        self.layers = layers
        self.neck_conv1 = Conv2d.load(vb.pp("neck.0"), dims[-1], NECK_CHANNELS, 1, bias=False)
        self.neck_ln1 = LayerNorm2d.load(vb.pp("neck.1"), NECK_CHANNELS)
        self.neck_conv2 = Conv2d.load(vb.pp("neck.2"), NECK_CHANNELS, NECK_CHANNELS, 3,
                                      Conv2dConfig(padding=1), bias=False)
        self.neck_ln2 = LayerNorm2d.load(vb.pp("neck.3"), NECK_CHANNELS)

    @classmethod
    def load(cls, vb: VarBuilder, variant: str = "5m") -> "TinyViT":
        """Build the ``variant`` (see ``TINY_VIT_CONFIGS``) from ``vb`` (``image_encoder``)."""
        if variant not in TINY_VIT_CONFIGS:
            raise ValueError(f"unknown TinyViT variant {variant!r}; "
                             f"choose one of {sorted(TINY_VIT_CONFIGS)}")
        return cls(vb, TINY_VIT_CONFIGS[variant])

    def forward(self, x: mx.array) -> mx.array:
        x = self.patch_embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.neck_ln2(self.neck_conv2(self.neck_ln1(self.neck_conv1(x))))


def tiny_vit_5m(vb: VarBuilder) -> TinyViT:
    """candle's ``tiny_vit_5m``: the MobileSAM encoder."""
    return TinyViT.load(vb, "5m")
