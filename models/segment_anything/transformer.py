"""SAM's two-way transformer (``mask_decoder.transformer.*``).

Prompt tokens and image tokens attend to each other in turn. Tokens are ``(B, T, 256)``; the
image is taken NHWC ``(B, H, W, 256)`` and flattened row-major to ``(B, H*W, 256)`` tokens.
"""

from __future__ import annotations

import math

import candle_nn as cn
from candle_nn import LayerNorm, Linear, Module, VarBuilder
import mlx.core as mx



class Attention(Module):
    """Multi-head attention whose q/k/v projections may shrink the width by ``downsample_rate``.

    Tensors ``q_proj``, ``k_proj``, ``v_proj`` (``dim → dim / downsample_rate``) and
    ``out_proj``. ``q (B, Lq, dim)``, ``k``, ``v (B, Lk, dim)`` → ``(B, Lq, dim)``.
    """

    def __init__(self, q_proj: Linear, k_proj: Linear, v_proj: Linear, out_proj: Linear,
                 num_heads: int) -> None:
        super().__init__(q_proj.device)
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = q_proj, k_proj, v_proj, out_proj

    @classmethod
    def load(cls, vb: VarBuilder, dim: int, num_heads: int,
             downsample_rate: int = 1) -> "Attention":
        internal = dim // downsample_rate
        return cls(*(Linear.load(vb.pp(name), dim, internal)
                     for name in ("q_proj", "k_proj", "v_proj")),
                   Linear.load(vb.pp("out_proj"), internal, dim), num_heads)

    def forward(self, q: mx.array, k: mx.array, v: mx.array,
                residual: mx.array | None = None) -> mx.array:
        """``[residual +] out_proj(attention(q_proj(q), k_proj(k), v_proj(v)))``.

        Between a few prompt tokens and many image tokens (``heads * few`` below the internal
        width and the other length) the few tokens' side is folded into the projection
        weights, so the image tokens are never projected: :meth:`_few_queries` (tokens →
        image), :meth:`_few_keys` (image → tokens). The same function in another order (equal
        within float32 rounding), differentiable as the direct one."""
        internal, heads = self.q_proj.weight.shape[0], self.num_heads
        if heads * k.shape[1] < min(internal, q.shape[1]):
            return self._few_keys(q, k, v, residual)
        if heads * q.shape[1] < min(internal, k.shape[1]):
            out = self._few_queries(q, k, v)
        else:
            out = self.out_proj(cn.multi_head_attention(self.q_proj(q), self.k_proj(k),
                                                        self.v_proj(v), heads))
        return out if residual is None else residual + out

    def _few_queries(self, q: mx.array, k: mx.array, v: mx.array) -> mx.array:
        """Few queries ``q (B, T, C)``, many keys and values ``(B or 1, N, C)``.

        Per head, scores ``(q Wqᵀ) (k Wkᵀ)ᵀ`` are ``((q Wqᵀ) Wk) kᵀ`` against the raw keys
        (``q``'s dot with the key bias is the same for every key: the softmax drops it), and
        the output ``P (v Wvᵀ + bv)`` is ``(P v) Wvᵀ + bv`` (each row of ``P`` sums to 1). Per
        prompt two products with ``N`` rows of inner size ``heads * T`` on the packed GEMM
        (``cn.ops.linear``): the scores transposed, ``k`` as the rows and the prompt's folded
        queries as the weight, then ``P v`` with ``vᵀ`` as the weight (packed from ``v`` as it
        is)."""
        b, t, c = q.shape
        heads = self.num_heads
        qh = _split_heads(self.q_proj(q), heads)  # (B, heads, T, d)
        d = qh.shape[-1]
        folded = (qh * (1.0 / math.sqrt(d))) @ head_weights(self.k_proj.weight, heads)
        folded = folded.reshape(b, heads * t, c)
        pooled = []
        for i in range(b):
            scores_t = cn.ops.linear(k[i if k.shape[0] > 1 else 0], folded[i])  # (N, heads T)
            probs = cn.softmax(scores_t.T)  # (heads T, N)
            pooled.append(cn.ops.linear(probs, v[i if v.shape[0] > 1 else 0].T))  # P v
        pooled = mx.stack(pooled).reshape(b, heads, t, c)
        out = pooled @ head_weights(self.v_proj.weight, heads).swapaxes(1, 2)  # (B, h, T, d)
        if "bias" in self.v_proj:
            out = out + self.v_proj.bias.reshape(heads, 1, d)
        return self.out_proj(out.transpose(0, 2, 1, 3).reshape(b, t, heads * d))

    def _few_keys(self, q: mx.array, k: mx.array, v: mx.array,
                  residual: mx.array | None) -> mx.array:
        """Many queries ``q (B or 1, N, C)``, few keys and values ``(B, T, C)``.

        Per head, scores ``(q Wqᵀ + bq) kᵀ`` are ``q (Wqᵀ k) + bq kᵀ`` and the output
        ``Σ_heads P (v Wo_headᵀ) + bo`` one product with the values already through the output
        projection: per prompt two products with ``N`` rows of inner size ``heads * T``, each a
        Linear layer whose small weight is the prompt's (``cn.ops.linear``: the image tokens are
        streamed, the residual rides on the second)."""
        b, t, c = k.shape
        n, heads = q.shape[1], self.num_heads
        kh = _split_heads(self.k_proj(k), heads)  # (B, heads, T, d)
        d = kh.shape[-1]
        kh = kh * (1.0 / math.sqrt(d))
        folded = (kh @ head_weights(self.q_proj.weight, heads)).reshape(b, heads * t, c)
        bias = (None if "bias" not in self.q_proj
                else (kh @ self.q_proj.bias.reshape(heads, d, 1)).reshape(b, heads * t))
        vh = _split_heads(self.v_proj(v), heads)  # (B, heads, T, d)
        wo = self.out_proj.weight.T.reshape(heads, d, -1)  # (heads, d, C): head h's rows of Woᵀ
        values = (vh @ wo).reshape(b, heads * t, -1)
        if "bias" in self.out_proj:
            values = values + self.out_proj.bias / heads
        values = mx.contiguous(values.swapaxes(1, 2))  # (B, C, heads T): Linear weights
        out = []
        for i in range(b):
            scores = cn.ops.linear(q[i if q.shape[0] > 1 else 0], folded[i],
                                   None if bias is None else bias[i])
            probs = cn.softmax(scores.reshape(n, heads, t)).reshape(n, heads * t)
            res = None if residual is None else residual[i if residual.shape[0] > 1 else 0]
            out.append(cn.ops.linear(probs, values[i], residual=res))
        return out[0][None] if b == 1 else mx.stack(out)


def _split_heads(x: mx.array, heads: int) -> mx.array:
    """``(B, L, heads * d)`` → ``(B, heads, L, d)``."""
    b, length, _ = x.shape
    return x.reshape(b, length, heads, -1).transpose(0, 2, 1, 3)


def head_weights(weight: mx.array, heads: int) -> mx.array:
    """A projection's ``(heads * d, C)`` weight (out, in) → ``(heads, d, C)``."""
    return weight.reshape(heads, -1, weight.shape[-1])


class MlpBlock(Module):
    """``lin2(act(lin1(x)))``; SAM's transformer uses ReLU."""

    def __init__(self, lin1: Linear, lin2: Linear, activation: str = "relu") -> None:
        super().__init__(lin1.device)
        self.lin1, self.lin2 = lin1, lin2
        self.activation = cn.Activation(activation)

    @classmethod
    def load(cls, vb: VarBuilder, dim: int, mlp_dim: int, activation: str = "relu") -> "MlpBlock":
        return cls(Linear.load(vb.pp("lin1"), dim, mlp_dim),
                   Linear.load(vb.pp("lin2"), mlp_dim, dim), activation)

    def forward(self, x: mx.array) -> mx.array:
        return self.lin2(self.activation(self.lin1(x)))


class TwoWayAttentionBlock(Module):
    """Self-attention of the tokens, tokens → image cross-attention, token MLP, then
    image → tokens cross-attention; each with a residual and a post-LayerNorm.

    The first block's self-attention has no positional encoding and no residual (SAM's
    ``skip_first_layer_pe``).
    """

    def __init__(self, self_attn: Attention, cross_attn_token_to_image: Attention,
                 cross_attn_image_to_token: Attention, mlp: MlpBlock, norms: list[LayerNorm],
                 skip_first_layer_pe: bool) -> None:
        """``norms``: ``norm1`` … ``norm4``, after self-attention, token → image attention, the
        MLP and image → token attention."""
        super().__init__(self_attn.device)
        self.skip_first_layer_pe = skip_first_layer_pe
        self.self_attn = self_attn
        self.cross_attn_token_to_image = cross_attn_token_to_image
        self.cross_attn_image_to_token = cross_attn_image_to_token
        self.mlp = mlp
        self.norm1, self.norm2, self.norm3, self.norm4 = norms

    @classmethod
    def load(cls, vb: VarBuilder, dim: int, num_heads: int, mlp_dim: int,
             skip_first_layer_pe: bool) -> "TwoWayAttentionBlock":
        return cls(Attention.load(vb.pp("self_attn"), dim, num_heads),
                   Attention.load(vb.pp("cross_attn_token_to_image"), dim, num_heads, 2),
                   Attention.load(vb.pp("cross_attn_image_to_token"), dim, num_heads, 2),
                   MlpBlock.load(vb.pp("mlp"), dim, mlp_dim),
                   [LayerNorm.load(vb.pp(f"norm{i}"), dim, 1e-5) for i in range(1, 5)],
                   skip_first_layer_pe)

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
        keys = self.norm4(self.cross_attn_image_to_token(k, q, queries, residual=keys))
        return queries, keys


class TwoWayTransformer(Module):
    """``depth`` two-way blocks, then a final tokens → image attention.

    ``forward(image (B, H, W, C), image_pe (B, H, W, C), tokens (B, T, C))`` →
    ``(tokens (B, T, C), image tokens (B, H*W, C))``.
    """

    def __init__(self, layers: list[TwoWayAttentionBlock], final_attn_token_to_image: Attention,
                 norm_final_attn: LayerNorm) -> None:
        super().__init__(final_attn_token_to_image.device)
        self.layers = layers
        self.final_attn_token_to_image = final_attn_token_to_image
        self.norm_final_attn = norm_final_attn

    @classmethod
    def load(cls, vb: VarBuilder, depth: int, dim: int, num_heads: int,
             mlp_dim: int) -> "TwoWayTransformer":
        layers = vb.pp("layers")
        return cls([TwoWayAttentionBlock.load(layers.pp(i), dim, num_heads, mlp_dim, i == 0)
                    for i in range(depth)],
                   Attention.load(vb.pp("final_attn_token_to_image"), dim, num_heads, 2),
                   LayerNorm.load(vb.pp("norm_final_attn"), dim, 1e-5))

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
