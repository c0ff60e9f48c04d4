"""SAM's two-way transformer (``mask_decoder.transformer.*``).

Prompt tokens and image tokens attend to each other in turn. Tokens are ``(B, T, 256)``; the
image is taken NHWC ``(B, H, W, 256)`` and flattened row-major to ``(B, H*W, 256)`` tokens.
"""

from __future__ import annotations

import candle_nn as cn
from candle_nn import LayerNorm, Linear, Module, VarBuilder
import mlx.core as mx



class Attention(Module):
    """Multi-head attention whose q/k/v projections may shrink the width by ``downsample_rate``.

    Tensors ``q_proj``, ``k_proj``, ``v_proj`` (``dim → dim / downsample_rate``) and
    ``out_proj``. ``q (B, Lq, dim)``, ``k``, ``v (B, Lk, dim)`` → ``(B, Lq, dim)``.
    """

    def __init__(self, vb: VarBuilder, dim: int, num_heads: int, downsample_rate: int = 1) -> None:
        super().__init__(vb.device)
        internal = dim // downsample_rate
        self.num_heads = num_heads
        self.q_proj = Linear.load(vb.pp("q_proj"), dim, internal)
        self.k_proj = Linear.load(vb.pp("k_proj"), dim, internal)
        self.v_proj = Linear.load(vb.pp("v_proj"), dim, internal)
        self.out_proj = Linear.load(vb.pp("out_proj"), internal, dim)

    def _heads(self, x: mx.array) -> mx.array:
        b, n, c = x.shape
        return x.reshape(b, n, self.num_heads, c // self.num_heads).transpose(0, 2, 1, 3)

    def forward(self, q: mx.array, k: mx.array, v: mx.array) -> mx.array:
        out = cn.scaled_dot_product_attention(self._heads(self.q_proj(q)),
                                              self._heads(self.k_proj(k)),
                                              self._heads(self.v_proj(v)))
        b, _, n, _ = out.shape
        return self.out_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


class MlpBlock(Module):
    """``lin2(act(lin1(x)))``; SAM's transformer uses ReLU."""

    def __init__(self, vb: VarBuilder, dim: int, mlp_dim: int, activation: str = "relu") -> None:
        super().__init__(vb.device)
        self.lin1 = Linear.load(vb.pp("lin1"), dim, mlp_dim)
        self.lin2 = Linear.load(vb.pp("lin2"), mlp_dim, dim)
        self.activation = cn.Activation(activation)

    def forward(self, x: mx.array) -> mx.array:
        return self.lin2(self.activation(self.lin1(x)))


class TwoWayAttentionBlock(Module):
    """Self-attention of the tokens, tokens → image cross-attention, token MLP, then
    image → tokens cross-attention; each with a residual and a post-LayerNorm.

    The first block's self-attention has no positional encoding and no residual (SAM's
    ``skip_first_layer_pe``).
    """

    def __init__(self, vb: VarBuilder, dim: int, num_heads: int, mlp_dim: int,
                 skip_first_layer_pe: bool) -> None:
        super().__init__(vb.device)
        self.skip_first_layer_pe = skip_first_layer_pe
        self.self_attn = Attention(vb.pp("self_attn"), dim, num_heads)
        self.norm1 = LayerNorm.load(vb.pp("norm1"), dim, 1e-5)
        self.cross_attn_token_to_image = Attention(vb.pp("cross_attn_token_to_image"), dim,
                                                   num_heads, 2)
        self.norm2 = LayerNorm.load(vb.pp("norm2"), dim, 1e-5)
        self.mlp = MlpBlock(vb.pp("mlp"), dim, mlp_dim)
        self.norm3 = LayerNorm.load(vb.pp("norm3"), dim, 1e-5)
        self.norm4 = LayerNorm.load(vb.pp("norm4"), dim, 1e-5)
        self.cross_attn_image_to_token = Attention(vb.pp("cross_attn_image_to_token"), dim,
                                                   num_heads, 2)

    def forward(self, queries: mx.array, keys: mx.array, query_pe: mx.array,
                key_pe: mx.array) -> tuple[mx.array, mx.array]:
        if self.skip_first_layer_pe:
            queries = self.self_attn(queries, queries, queries)
        else:
            q = queries + query_pe
            queries = queries + self.self_attn(q, q, queries)
        queries = self.norm1(queries)

        q, k = queries + query_pe, keys + key_pe
        queries = self.norm2(queries + self.cross_attn_token_to_image(q, k, keys))

        queries = self.norm3(queries + self.mlp(queries))

        q, k = queries + query_pe, keys + key_pe
        keys = self.norm4(keys + self.cross_attn_image_to_token(k, q, queries))
        return queries, keys


class TwoWayTransformer(Module):
    """``depth`` two-way blocks, then a final tokens → image attention.

    ``forward(image (B, H, W, C), image_pe (B, H, W, C), tokens (B, T, C))`` →
    ``(tokens (B, T, C), image tokens (B, H*W, C))``.
    """

    def __init__(self, vb: VarBuilder, depth: int, dim: int, num_heads: int, mlp_dim: int) -> None:
        super().__init__(vb.device)
        self.layers = [TwoWayAttentionBlock(vb.pp("layers").pp(i), dim, num_heads, mlp_dim, i == 0)
                       for i in range(depth)]
        self.final_attn_token_to_image = Attention(vb.pp("final_attn_token_to_image"), dim,
                                                   num_heads, 2)
        self.norm_final_attn = LayerNorm.load(vb.pp("norm_final_attn"), dim, 1e-5)

    def forward(self, image: mx.array, image_pe: mx.array,
                tokens: mx.array) -> tuple[mx.array, mx.array]:
        b, h, w, c = image.shape
        keys = image.reshape(b, h * w, c)
        key_pe = image_pe.reshape(image_pe.shape[0], h * w, c)
        queries = tokens
        for layer in self.layers:
            queries, keys = layer(queries, keys, tokens, key_pe)
        q, k = queries + tokens, keys + key_pe
        queries = self.norm_final_attn(queries + self.final_attn_token_to_image(q, k, keys))
        return queries, keys
