"""TinyViT image encoder of MobileSAM (``image_encoder.*``), NHWC throughout.

Input ``(B, 1024, 1024, 3)`` normalised pixels → image embeddings ``(B, 64, 64, 256)``.

Structure (MobileSAM's ``tiny_vit_sam.py``, candle's ``tiny_vit.rs``): a stride-4 conv stem,
one MBConv stage, three stages of windowed attention blocks (attention + a depthwise "local"
conv + an MLP), patch merging between stages, and a neck of two convolutions with LayerNorm2d.
Every Conv2d+BatchNorm pair (``*.c`` / ``*.bn``) is folded into one convolution at load (kept as
layers with ``TinyViT.load(..., fold_bn=False)`` / ``Sam.load(..., fold_bn=False)``, to train).
"""

from __future__ import annotations

from dataclasses import dataclass

import candle_nn as cn
from candle_nn import Conv2d, Conv2dConfig, ConvBn, LayerNorm, Linear, Module, VarBuilder
import mlx.core as mx
import numpy as np

from .neck import Neck

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
              config: Conv2dConfig = Conv2dConfig(), fold_bn: bool = True) -> "Conv2d | ConvBn":
    """MobileSAM's ``Conv2d_BN``: ``c`` (no bias) then ``bn`` (eps 1e-5, momentum 0.1), one
    Conv2d (``fold_bn=False``: a :class:`ConvBn`, to train)."""
    return ConvBn.load(vb, in_channels, out_channels, kernel_size, config, conv="c",
                       fold_bn=fold_bn)


class PatchEmbed(Module):
    """Two stride-2 3x3 conv-BN with a GELU between: ``(B, H, W, 3)`` → ``(B, H/4, W/4, dim)``."""

    def __init__(self, conv1: Conv2d, conv2: Conv2d) -> None:
        super().__init__(conv1.device)
        self.conv1, self.conv2 = conv1, conv2

    @classmethod
    def load(cls, vb: VarBuilder, in_channels: int, embed_dim: int,
             fold_bn: bool = True) -> "PatchEmbed":
        cfg = Conv2dConfig(stride=2, padding=1)
        return cls(conv2d_bn(vb.pp("seq.0"), in_channels, embed_dim // 2, 3, cfg, fold_bn),
                   conv2d_bn(vb.pp("seq.2"), embed_dim // 2, embed_dim, 3, cfg, fold_bn))

    def forward(self, x: mx.array) -> mx.array:
        return self.conv2(self.conv1(x, activation="gelu"))


class ThreeConvs(Module):
    """What :class:`MBConv` and :class:`PatchMerging` hold: a 1x1 conv, a 3x3 depthwise conv and
    a 1x1 conv (``conv1`` … ``conv3``, each conv-BN)."""

    def __init__(self, conv1: Conv2d, conv2: Conv2d, conv3: Conv2d) -> None:
        super().__init__(conv1.device)
        self.conv1, self.conv2, self.conv3 = conv1, conv2, conv3

    @classmethod
    def load(cls, vb: VarBuilder, dim: int, hidden: int, out: int, stride: int = 1,
             fold_bn: bool = True) -> "ThreeConvs":
        """``dim`` → ``hidden`` → (depthwise, ``stride``) → ``out`` channels."""
        return cls(conv2d_bn(vb.pp("conv1"), dim, hidden, 1, fold_bn=fold_bn),
                   conv2d_bn(vb.pp("conv2"), hidden, hidden, 3,
                             Conv2dConfig(padding=1, stride=stride, groups=hidden), fold_bn),
                   conv2d_bn(vb.pp("conv3"), hidden, out, 1, fold_bn=fold_bn))


class MBConv(ThreeConvs):
    """Inverted residual: 1x1 expand, 3x3 depthwise, 1x1 project, residual, GELU. Shape kept."""

    @classmethod
    def load(cls, vb: VarBuilder, dim: int,  # type: ignore[override]
             expand_ratio: int = MBCONV_EXPAND_RATIO, fold_bn: bool = True) -> "MBConv":
        return super().load(vb, dim, dim * expand_ratio, dim,  # type: ignore[return-value]
                            fold_bn=fold_bn)

    def forward(self, x: mx.array) -> mx.array:
        y = self.conv2(self.conv1(x, activation="gelu"), activation="gelu")
        return self.conv3(y, activation="gelu", residual=x)


class PatchMerging(ThreeConvs):
    """1x1 conv, 3x3 depthwise conv (stride 2, or 1 for the widest stages), 1x1 conv.

    ``(B, H, W, dim)`` → ``(B, H/stride, W/stride, out)``.
    """

    @classmethod
    def load(cls, vb: VarBuilder, dim: int, out: int,  # type: ignore[override]
             fold_bn: bool = True) -> "PatchMerging":
        stride = 1 if out in (320, 448, 576) else 2  # MobileSAM keeps 64x64 for the last stage
        return super().load(vb, dim, out, out, stride, fold_bn)  # type: ignore[return-value]

    def forward(self, x: mx.array) -> mx.array:
        return self.conv3(self.conv2(self.conv1(x, activation="gelu"), activation="gelu"))


class ConvLayer(Module):
    """Stage 0: ``depth`` MBConv blocks then patch merging to ``out`` channels."""

    def __init__(self, blocks: list[MBConv], downsample: PatchMerging) -> None:
        super().__init__(downsample.device)
        self.blocks = blocks
        self.downsample = downsample

    @classmethod
    def load(cls, vb: VarBuilder, dim: int, out: int, depth: int,
             fold_bn: bool = True) -> "ConvLayer":
        return cls([MBConv.load(vb.pp("blocks").pp(i), dim, fold_bn=fold_bn)
                    for i in range(depth)],
                   PatchMerging.load(vb.pp("downsample"), dim, out, fold_bn))

    def forward(self, x: mx.array) -> mx.array:
        for block in self.blocks:
            x = block(x)
        return self.downsample(x)


class Mlp(Module):
    """Pre-norm MLP: LayerNorm, fc1, GELU, fc2. ``(..., dim)`` → ``(..., dim)``."""

    def __init__(self, norm: LayerNorm, fc1: Linear, fc2: Linear) -> None:
        super().__init__(fc1.device)
        self.norm, self.fc1, self.fc2 = norm, fc1, fc2

    @classmethod
    def load(cls, vb: VarBuilder, dim: int, hidden: int) -> "Mlp":
        return cls(LayerNorm.load(vb.pp("norm"), dim, 1e-5), Linear.load(vb.pp("fc1"), dim, hidden),
                   Linear.load(vb.pp("fc2"), hidden, dim))

    def forward(self, x: mx.array, residual: mx.array | None = None) -> mx.array:
        """``fc2(gelu(fc1(norm(x)))) [+ residual]`` (the add fused into fc2's epilogue)."""
        return self.fc2(self.fc1(self.norm(x), activation="gelu"), residual=residual)


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
    """Multi-head self-attention inside ``window`` x ``window`` tiles of an image, with a learned
    bias per head and offset.

    Input ``(B, H, W, dim)`` → ``(B, H, W, dim)``; H and W need not be multiples of the window
    (MobileSAM zero-pads the image to whole windows before the norm: those tokens are keys and
    values too). Tensors: ``norm``, ``qkv`` (per head: q, k, v of ``dim / heads`` each),
    ``proj``, ``attention_biases`` ``(heads, num_offsets)``. The biases are gathered into
    ``(heads, N, N)`` (``N = window²``) on every call, so a change to ``attention_biases``
    always takes effect.
    """

    def __init__(self, norm: LayerNorm, qkv: Linear, proj: Linear, attention_biases: mx.array,
                 window: int) -> None:
        super().__init__(qkv.device)
        self.num_heads = int(attention_biases.shape[0])
        self.head_dim = proj.out_features // self.num_heads
        self.window = window
        self.norm, self.qkv, self.proj = norm, qkv, proj
        self.attention_biases = attention_biases
        self._bias_index = mx.array(attention_bias_index(window))  # "_": not a parameter

    @classmethod
    def load(cls, vb: VarBuilder, dim: int, num_heads: int, window: int) -> "WindowAttention":
        offsets = int(attention_bias_index(window).max()) + 1
        return cls(LayerNorm.load(vb.pp("norm"), dim, 1e-5),
                   Linear.load(vb.pp("qkv"), dim, 3 * dim), Linear.load(vb.pp("proj"), dim, dim),
                   vb.get((num_heads, offsets), "attention_biases"), window)

    def forward(self, x: mx.array, residual: mx.array | None = None) -> mx.array:
        """``proj(attention(qkv(norm(x)))) [+ residual]`` (the add fused into proj's epilogue).

        The norm and both projections act per token, so they run on the image in place; a
        padding token's q, k, v are the projection of a normed zero token.
        """
        b, h, w, c = x.shape
        if self.device is not None and self.device.kind == "gpu":
            return self._forward_windows(x, residual)
        qkv = self.qkv(self.norm(x))
        pad = None
        if h % self.window or w % self.window:
            pad = self.qkv(self.norm(mx.zeros((1, c), x.dtype)))[0]
        bias = mx.take(self.attention_biases, self._bias_index, axis=1)  # (heads, N, N)
        out = cn.window_attention(qkv, self.num_heads, self.window, scale=self.head_dim ** -0.5,
                                  bias=bias, pad=pad)
        return self.proj(out, residual=residual)

    def _forward_windows(self, x: mx.array, residual: mx.array | None) -> mx.array:
        """The same attention on an image cut into whole windows (zero-padded) and merged back.

        On a GPU :func:`cn.window_attention` runs its MLX reference, whose padding and
        partition of the three times wider ``qkv`` cost more than cutting the image itself."""
        b, h, w, _ = x.shape
        windows = cn.ops.window_partition(x, self.window)
        bias = mx.take(self.attention_biases, self._bias_index, axis=1)  # (heads, N, N)
        y = self.proj(cn.packed_qkv_attention(self.qkv(self.norm(windows)), self.num_heads,
                                              scale=self.head_dim ** -0.5, bias=bias))
        y = cn.ops.window_merge(y, b, h, w, self.window)
        return y if residual is None else residual + y


class TinyViTBlock(Module):
    """Windowed attention (zero-padded to whole windows), residual; depthwise 3x3 local conv;
    MLP, residual. ``(B, H, W, dim)`` → same shape."""

    def __init__(self, attn: WindowAttention, local_conv: Conv2d, mlp: Mlp, window: int) -> None:
        super().__init__(attn.device)
        self.window = window
        self.attn, self.local_conv, self.mlp = attn, local_conv, mlp

    @classmethod
    def load(cls, vb: VarBuilder, dim: int, num_heads: int, window: int,
             fold_bn: bool = True) -> "TinyViTBlock":
        return cls(WindowAttention.load(vb.pp("attn"), dim, num_heads, window),
                   conv2d_bn(vb.pp("local_conv"), dim, dim, LOCAL_CONV_SIZE,
                             Conv2dConfig(padding=LOCAL_CONV_SIZE // 2, groups=dim), fold_bn),
                   Mlp.load(vb.pp("mlp"), dim, dim * MLP_RATIO), window)

    def forward(self, x: mx.array) -> mx.array:
        x = self.local_conv(self.attn(x, residual=x))
        return self.mlp(x, residual=x)


class BasicLayer(Module):
    """A stage of TinyViT blocks, then (except for the last stage) patch merging to ``out``."""

    def __init__(self, blocks: list[TinyViTBlock], downsample: PatchMerging | None) -> None:
        """``downsample``: ``None`` for the last stage, which keeps its resolution and width."""
        super().__init__(blocks[0].device)
        self.blocks = blocks
        if downsample is not None:
            self.downsample = downsample

    @classmethod
    def load(cls, vb: VarBuilder, dim: int, depth: int, num_heads: int, window: int,
             out: int | None, fold_bn: bool = True) -> "BasicLayer":
        """``out=None``: the last stage, without patch merging."""
        return cls([TinyViTBlock.load(vb.pp("blocks").pp(i), dim, num_heads, window, fold_bn)
                    for i in range(depth)],
                   None if out is None
                   else PatchMerging.load(vb.pp("downsample"), dim, out, fold_bn))

    def forward(self, x: mx.array) -> mx.array:
        for block in self.blocks:
            x = block(x)
        return self.downsample(x) if "downsample" in self else x


class TinyViT(Module):
    """MobileSAM's TinyViT image encoder (classification head unused).

    ``(B, 1024, 1024, 3)`` → ``(B, 64, 64, 256)``. Load with :meth:`load` under the
    ``image_encoder`` prefix.

    Args:
        patch_embed: the stride-4 stem.
        layers: the MBConv stage (:class:`ConvLayer`), then the attention stages
            (:class:`BasicLayer`).
        neck: the conv/LayerNorm2d neck (:class:`Neck`).
    """

    def __init__(self, patch_embed: PatchEmbed, layers: list[Module], neck: Neck) -> None:
        super().__init__(patch_embed.device)
        self.patch_embed = patch_embed
        self.layers = layers
        self.neck = neck
        self.eval()  # a model predicts as loaded; model.train() to train

    @classmethod
    def load(cls, vb: VarBuilder, variant: "str | TinyViTConfig" = "5m", *,
             fold_bn: bool = True) -> "TinyViT":
        """Build ``variant`` (a key of ``TINY_VIT_CONFIGS`` or a :class:`TinyViTConfig`) from
        ``vb`` (``image_encoder``); ``fold_bn=False`` keeps the BatchNorms, to train."""
        if isinstance(variant, str):
            if variant not in TINY_VIT_CONFIGS:
                raise ValueError(f"unknown TinyViT variant {variant!r}; "
                                 f"choose one of {sorted(TINY_VIT_CONFIGS)}")
            variant = TINY_VIT_CONFIGS[variant]
        c, dims = variant, variant.embed_dims
        f = fold_bn
        patch_embed = PatchEmbed.load(vb.pp("patch_embed"), IN_CHANNELS, dims[0], f)
        layers: list[Module] = [ConvLayer.load(vb.pp("layers.0"), dims[0], dims[1], c.depths[0],
                                               f)]
        for i in range(1, len(dims)):
            out = dims[i + 1] if i + 1 < len(dims) else None
            layers.append(BasicLayer.load(vb.pp("layers").pp(i), dims[i], c.depths[i],
                                          c.num_heads[i], c.window_sizes[i], out, f))
        encoder = cls(patch_embed, layers, Neck.load(vb.pp("neck"), dims[-1], NECK_CHANNELS))
        # MobileSAM's files keep TinyViT's ImageNet classifier (norm_head, head), unused by SAM,
        # and may keep the attention-bias index buffers (recomputed here)
        vb.check_all_read(f"TinyViT {c.embed_dims}",
                          unused=("norm_head.*", "head.*", "*attention_bias_idxs"))
        return encoder

    def forward(self, x: mx.array) -> mx.array:
        x = self.patch_embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.neck(x)
