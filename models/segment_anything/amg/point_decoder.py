"""``PointGridDecoder``: SAM's prompt encoder + mask decoder for many single-point prompts
against one image embedding, the way automatic mask generation asks (one foreground point per
prompt, no box, no mask input, three masks each).

The same function as ``Sam.forward(features, (coords, ones), multimask_output=True)``, computed
in another order (equal within float32 rounding):

* everything about the image that no prompt changes — the no-mask dense embedding added to the
  image embedding, the positional encoding, the first block's image-side projections, and the
  shared rows below with their projections — is computed once per image in the constructor;
* attention between the 7 prompt tokens and the 4096 image tokens never projects the image side
  per prompt: the token side is folded into the projection weights instead
  (``(x Wk) qᵀ = x (Wk qᵀ)``, ``A (x Wv) = (A x) Wv``), and image → tokens attention applies
  its output projection to the 7 tokens' values (``P (V Wo)``);
* the per-prompt image tokens are never materialised: after each block they are factored rows
  ``scale y + coeff basis + bias`` (``y1``, ``y2 (n, c)`` shared rows: ``keys0`` centred
  times the first LayerNorm's weight, that centred times the second's; ``scale (b, n)`` the
  LayerNorms' per-row ``1 / std``; ``coeff (b, n, m)``, ``basis (b, m, c)`` per prompt: after
  the first block ``m = 56``, its attention probabilities over the tokens' values through the
  output projection; after the second ``m = 112``, both blocks', the second's values carrying
  the first LayerNorm's bias). Every use of the image tokens is a product with the shared
  rows' per-head projections (once per image) plus one with the ``m`` coefficients per prompt;
  the LayerNorms' row statistics come from centred forms (``|s z + u B|² = s² |z|² + 2 s u (z
  Bᵀ) + u (B Bᵀ) uᵀ``, ``z Bᵀ`` through the image side's products with the output
  projections);
* :meth:`decode` stops at the tokens: predicted IoUs and the masks' hypernetwork vectors; the
  output upscaling runs in :meth:`masks` only for the prompts and masks the caller keeps (those
  that pass the predicted-IoU filter), its first transposed conv factored the same way
  (``y2 W1ᵀ`` per image plus ``coeff (basis W1ᵀ)``).

Per prompt about 180 M multiply-adds between the tokens and the image tokens (433 M with the
image tokens whole; the final attention runs only for the 4 tokens that the heads read) and
265 M for a kept prompt's upscaling (409 M). The per-prompt work goes through candle_nn's ops
``point_probs``, ``point_norm``, ``point_pool`` (:mod:`candle_nn.ops.point_attention`) and
``mask_upscale``: on the CPU compiled kernels, one prompt or block of its rows per task on the
thread pool; elsewhere their plain-MLX references, whose products with the shared rows are one
GEMM for all prompts.

Shapes: the image grid is ``n = 64 * 64`` tokens of ``c = 256``; a batch has ``b`` prompts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import candle_nn as cn
import mlx.core as mx
import numpy as np
from mlx.utils import tree_map

from ..transformer import head_weights

if TYPE_CHECKING:
    from candle_nn import ConvTranspose2d, LayerNorm

    from ..sam import Sam
    from ..transformer import Attention

MULTIMASK = slice(1, 4)  # SAM's multimask output: mask tokens 1..3 (token 0 is the single mask)


class PointGridDecoder:
    """Single-point prompts against one image embedding ``(1, h, w, c)`` (NHWC)."""

    chunk = 16  # prompts upscaled together by :meth:`masks` (as MLX ops: ~25 MB a prompt)

    def __init__(self, sam: "Sam", image_embeddings: mx.array,
                 compiled: bool = False) -> None:
        if image_embeddings.shape[0] != 1:
            raise ValueError(f"one image embedding at a time, not {image_embeddings.shape[0]}")
        self.sam = sam
        pe = sam.prompt_encoder
        _, h, w, c = image_embeddings.shape
        self.grid = (h, w)
        with sam.on_device():
            dense = pe.no_mask_embed.embeddings.reshape(1, 1, 1, -1)
            keys0 = (image_embeddings + dense).reshape(h * w, c)
            key_pe = pe.get_dense_pe().reshape(h * w, c).astype(keys0.dtype)
            # contiguous once here: the CPU kernels would copy a transposed view on every call
            self.image_side = tree_map(mx.contiguous, _image_side(sam, keys0, key_pe))
            mx.eval(self.image_side)
        self.compiled = compiled
        self._upscaling: tuple[tuple[mx.array, mx.array], ...] | None = None

    def decode(self, coords: mx.array) -> tuple[mx.array, tuple]:
        """``coords (b, 2)`` point ``(x, y)`` in the 1024 input frame → predicted IoUs
        ``(b, 3)`` and the state :meth:`masks` needs: the image tokens after the transformer
        as factored rows over the image side's ``y2`` (``scale (b, n)``, ``coeff (b, n, m)``,
        ``basis (b, m, c)``) and the three masks' hypernetwork vectors ``(b, 3, c / 8)``.

        Under ``mx.compile`` where ``compiled``: one trace per batch size and model, the image
        side an input. Off by default: on the CPU the kernels beat MLX's compiled code, and on an
        H100 the trace's first call costs minutes of kernel compilation for no steady gain."""
        with self.sam.on_device():
            if not self.compiled:
                return _decode(self.sam, coords, self.image_side)
            cache = self.sam.__dict__.setdefault("_point_grid_decode", {})
            fn = cache.get(repr(self.sam.device))  # traced on that device's stream
            if fn is None:
                sam = self.sam
                fn = cache[repr(sam.device)] = mx.compile(lambda c, side: _decode(sam, c, side))
            return fn(coords, self.image_side)

    def masks(self, state: tuple, prompts: np.ndarray, which: np.ndarray) -> mx.array:
        """Low-res logits ``(k, 4h, 4w)`` of mask ``which[i]`` (0..2) of prompt ``prompts[i]``
        (host indices into the batch :meth:`decode` made ``state`` for).

        The decoder's output upscaling (transposed conv 2x2/2, LayerNorm2d, GELU, transposed
        conv 2x2/2, GELU) runs once per prompt listed, ``chunk`` prompts at a time, and stays
        in the convolutions' block layout — per embedding pixel, its 2x2 and then 4x4 output
        pixels side by side — so that the wide intermediates are never transposed; only the
        one-channel masks are put in image order at the end."""
        keys, hyper = state
        h, w = self.grid
        prompts, which = np.asarray(prompts, dtype=np.int64), np.asarray(which, dtype=np.int64)
        unique, inverse = np.unique(prompts, return_inverse=True)
        with self.sam.on_device():
            per_prompt = []
            for part in np.array_split(unique, -(-len(unique) // self.chunk)):
                part = mx.array(part)
                per_prompt.append(self._upscale(tuple(k[part] for k in keys), hyper[part]))
            per_prompt = mx.concatenate(per_prompt, axis=0)
            rows = mx.array(inverse.reshape(-1) * per_prompt.shape[1] + which)
            x = per_prompt.reshape(-1, h * w * 16)[rows]  # (k, n 16), block layout
            return self.sam.mask_decoder.blocks_to_image(x, (h, w))

    def _upscale(self, keys: tuple, hyper: mx.array) -> mx.array:
        """``keys``: factored rows as :meth:`decode` makes them, for ``u`` prompts; ``hyper
        (u, 3, c/8)`` → the three masks of each prompt in block layout ``(u, 3, n, 16)``. The
        first Linear of the image tokens is ``scale (y2 W1ᵀ) + coeff (basis W1ᵀ) + (LN bias)
        W1ᵀ + b1``, ``y2 W1ᵀ`` from the image side."""
        md = self.sam.mask_decoder
        if self._upscaling is None:
            self._upscaling = tuple(_blocks_as_linear(conv) for conv in
                                    (md.output_upscaling_conv1, md.output_upscaling_conv2))
        (w1, b1), (w2, b2) = self._upscaling
        ln = md.output_upscaling_ln
        scale, coeff, basis = keys
        bias = md.transformer.layers[1].norm4.bias @ w1.T + b1
        return cn.ops.mask_upscale(scale, self.image_side["upscale"], coeff, basis @ w1.T, bias,
                                   ln.weight, ln.bias, ln.config.eps, w2, b2, hyper)


def _image_side(sam: "Sam", keys0: mx.array, key_pe: mx.array) -> dict:
    """Everything :func:`_decode` needs of the image, from the image tokens with the no-mask
    embedding ``keys0 (n, c)`` and the positional encoding ``key_pe (n, c)``: per-head
    products ``(heads, n, d)`` and per-row sums ``(n,)`` of the shared rows (module
    docstring), the upscaling's first Linear of ``y2`` ``(n, 4 c1)``."""
    md = sam.mask_decoder
    (first, second), last = md.transformer.layers, md.transformer.final_attn_token_to_image
    t2i, i2t = first.cross_attn_token_to_image, first.cross_attn_image_to_token
    t2i2, i2t2 = second.cross_attn_token_to_image, second.cross_attn_image_to_token
    heads = i2t.num_heads
    g1, g2 = first.norm4.weight, second.norm4.weight
    centred0 = keys0 - keys0.mean(-1, keepdims=True)
    y1 = centred0 * g1
    z = y1 - y1.mean(-1, keepdims=True)  # y1 centred: the second block's LayerNorm input
    y2 = z * g2
    wo1, bo1 = i2t.out_proj.weight, i2t.out_proj.bias
    wo2, bo2 = i2t2.out_proj.weight, i2t2.out_proj.bias
    zg1 = z * g1

    def proj(x: mx.array, weight: mx.array) -> mx.array:  # (heads, n, d)
        return _heads(x @ weight.T, heads)

    # z · (centred values of the first block): per head (z g1) Wo1 · v, plus z g1 · bo1 / heads,
    # minus the values' row mean times z g1's row sum; as one per-head product with v extended
    # by (1, mean) (see _image_to_tokens).
    extra = mx.stack([(zg1 @ bo1) / heads, -zg1.sum(-1)], axis=-1)  # (n, 2)
    z_first = mx.concatenate([_heads(zg1 @ wo1, heads),
                              mx.broadcast_to(extra[None], (heads,) + extra.shape)], axis=-1)
    return {
        # the first block: its image side is the same for every prompt
        "first_keys": _heads(t2i.k_proj(keys0 + key_pe), t2i.num_heads),
        "first_values": _heads(t2i.v_proj(keys0), t2i.num_heads),
        "first_queries": _heads(i2t.q_proj(keys0 + key_pe), heads),
        "centred0_sq": (centred0 * centred0).sum(-1),
        "centred0_out": proj(centred0, wo1.T),
        "centred0_bias": centred0 @ bo1,
        # later blocks: the positional encoding's share of the scores
        "pe_keys": [_heads(key_pe @ attn.k_proj.weight.T, attn.num_heads)
                    for attn in (t2i2, last)],
        "pe_queries": _heads(i2t2.q_proj(key_pe), heads),
        # the second block, on y1 (and z, its LayerNorm's input)
        "second_keys": (proj(y1, t2i2.k_proj.weight), proj(y1, t2i2.v_proj.weight)),
        "second_queries": proj(y1, i2t2.q_proj.weight),
        "z_sq": (z * z).sum(-1),
        "z_first": z_first,  # (heads, n, d + 2)
        "z_out": proj(z, wo2.T),
        "z_bias": z @ bo2 + z @ first.norm4.bias,
        # the final attention and the upscaling's first Linear, on y2
        "final_keys": (proj(y2, last.k_proj.weight), proj(y2, last.v_proj.weight)),
        "upscale": y2 @ _blocks_as_linear(md.output_upscaling_conv1)[0].T,
    }


def _decode(sam: "Sam", coords: mx.array, side: dict) -> tuple[mx.array, tuple]:
    """:meth:`PointGridDecoder.decode` with the image side ``side`` an argument (a pure
    function of its inputs and the model's weights, as ``mx.compile`` needs)."""
    pe, md = sam.prompt_encoder, sam.mask_decoder
    tr = md.transformer
    b = coords.shape[0]
    dtype = md.iou_token.embeddings.dtype
    output_tokens = mx.concatenate([md.iou_token.embeddings, md.mask_tokens.embeddings])
    sparse = pe.embed_points(coords[:, None, :], mx.ones((b, 1), dtype=mx.float32),
                             pad=True).astype(dtype)
    tokens = mx.concatenate(
        [mx.broadcast_to(output_tokens[None], (b,) + output_tokens.shape), sparse],
        axis=1)  # (b, 7, c)

    first, second = tr.layers
    queries = first.norm1(first.self_attn(tokens, tokens, tokens))  # no PE, no residual
    queries = first.norm2(queries + _tokens_to_first_image(
        first.cross_attn_token_to_image, side, queries + tokens))
    queries = first.norm3(queries + first.mlp(queries))
    keys, first_values = _first_image_to_tokens(first.cross_attn_image_to_token, first.norm4,
                                                side, queries + tokens, queries)

    q = queries + tokens
    queries = second.norm1(queries + second.self_attn(q, q, queries))
    queries = second.norm2(queries + _tokens_to_image(
        second.cross_attn_token_to_image, queries + tokens, keys, side["second_keys"],
        side["pe_keys"][0]))
    queries = second.norm3(queries + second.mlp(queries))
    keys = _image_to_tokens(second.cross_attn_image_to_token, second.norm4, side, keys,
                            first_values, queries + tokens, queries)

    # The final attention, token by token: only for the IoU token and the multimask tokens.
    used = [0] + [1 + i for i in range(MULTIMASK.start, MULTIMASK.stop)]
    queries, tokens = queries[:, used], tokens[:, used]
    queries = tr.norm_final_attn(queries + _tokens_to_image(
        tr.final_attn_token_to_image, queries + tokens, keys, side["final_keys"],
        side["pe_keys"][1]))
    iou = md.iou_prediction_head(queries[:, 0])[:, MULTIMASK]
    hyper = mx.stack([md.output_hypernetworks_mlps[i](queries[:, j])
                      for j, i in enumerate(range(MULTIMASK.start, MULTIMASK.stop), 1)], axis=1)
    return iou, (keys[:3], hyper)


# -- attention between the prompt tokens and the image tokens ----------------------------------
def _tokens_to_first_image(attn: "Attention", side: dict, q_in: mx.array) -> mx.array:
    """Tokens → image attention of the first block, whose image side is the same for every
    prompt: keys and values from the image side."""
    b, t, _ = q_in.shape
    q = _scaled_heads(attn.q_proj(q_in), attn.num_heads)  # (heads, b t, d)
    out = cn.ops.point_pool(None, None, None, None, side["first_keys"], q,
                            side["first_values"])  # (heads, b t, d)
    return attn.out_proj(out.transpose(1, 0, 2).reshape(b, t, -1))


def _first_image_to_tokens(attn: "Attention", norm: "LayerNorm", side: dict, k_in: mx.array,
                           v_in: mx.array) -> tuple[tuple, tuple]:
    """The first block's image tokens after its image → tokens attention and ``norm``, as
    factored rows ``(scale, coeff, basis, bias)`` over ``y1``, and the values ``(v, mean)``
    the second block's LayerNorm needs.

    ``LN(keys0 + P V)``: the scores are the image side's queries alone, ``P (b, n, r)``; with
    ``V`` row-centred, ``keys0 + P V`` centred is ``centred0 + P Vc``, whose squared norm is
    ``|centred0|² + 2 P (centred0 Vᵀ) + P (Vc Vcᵀ) Pᵀ`` per row, ``centred0 Vᵀ`` per head
    ``(centred0 Wo) vᵀ`` plus ``centred0 · bo / heads``."""
    b = k_in.shape[0]
    heads = attn.num_heads
    k = _scaled_heads(attn.k_proj(k_in), heads)  # (heads, b t, d)
    v = _heads(attn.v_proj(v_in), heads)
    values = _values_through_output(attn, v, b)  # (b, r, c)
    mean = values.mean(-1)  # (b, r)
    centred = values - mean[..., None]
    probs = cn.ops.point_probs(side["first_queries"], k, k_in.shape[1])  # (b, n, r)
    coeff = cn.ops.point_norm(probs, side["centred0_sq"], side["centred0_out"], v,
                              side["centred0_bias"], _gram(centred), norm.config.eps,
                              centred.shape[-1])  # (b, n, r): 1 / std times P
    scale = coeff.sum(-1) / heads  # each head's probabilities sum to 1
    return (scale, coeff, centred * norm.weight, norm.bias), (v, mean)


def _image_to_tokens(attn: "Attention", norm: "LayerNorm", side: dict, keys: tuple,
                     first_values: tuple, k_in: mx.array, v_in: mx.array) -> tuple:
    """The second block's image tokens (``keys``, the first block's factored rows) after its
    image → tokens attention and ``norm``, factored over ``y2``.

    ``keys`` centred is ``scale z + coeff basisc + biasc`` (``z = y1`` centred, ``c``
    row-centred), so ``keys + P V`` centred is ``scale z + u B`` with ``u = [coeff, P]``,
    ``B = [basisc; (V + bias / heads)c]`` (each head's probabilities sum to 1: ``P`` carries
    the bias), ``m = 2 r`` rows; ``z Bᵀ`` per head: ``z basisᵀ = (z g1) Vc₁ᵀ`` from the first
    block's values ``(v, mean)``, ``z Vᵀ`` from this block's, ``z · bias`` per image."""
    scale, coeff, basis, bias = keys
    b = k_in.shape[0]
    heads = attn.num_heads
    k, folded = _fold(attn.k_proj(k_in), attn.q_proj.weight, heads, b)
    probs = cn.ops.point_probs(side["pe_queries"], k, k_in.shape[1], scale,
                               side["second_queries"], coeff,
                               folded @ basis.swapaxes(1, 2), folded @ bias)
    v = _heads(attn.v_proj(v_in), heads)
    values = _values_through_output(attn, v, b) + bias / heads
    v1, mean1 = first_values
    rows = mx.concatenate([basis, values], axis=1)
    rows = rows - rows.mean(-1, keepdims=True)
    t = v1.shape[1] // b
    mean1 = mean1.reshape(b, heads, t).transpose(1, 0, 2).reshape(heads, b * t, 1)
    v1_ext = mx.concatenate([v1, mx.ones_like(mean1), mean1], axis=-1)  # (heads, b t, d + 2)
    u = cn.ops.point_norm(probs, side["z_sq"], side["z_out"], v, side["z_bias"], _gram(rows),
                          norm.config.eps, rows.shape[-1], scale, coeff,
                          side["z_first"], v1_ext)  # (b, n, 2 r): 1 / std times [coeff, P]
    inv = u[..., coeff.shape[-1]:].sum(-1) / heads
    return scale * inv, u, rows * norm.weight, norm.bias


def _tokens_to_image(attn: "Attention", q_in: mx.array, keys: tuple, shared: tuple,
                     pe_keys: mx.array) -> mx.array:
    """Tokens → image attention, keys ``image + PE`` and values ``image``, the image tokens
    the factored rows ``keys`` over the shared rows ``y`` and ``shared = (y Wkᵀ, y Wvᵀ)``
    per head (image side): scores ``scale (y Wkᵀ) qᵀ + coeff (basis foldedᵀ)`` plus the PE's
    share (``folded = q Wk``; the bias's dot with the folded queries and ``q``'s dot with the
    key bias are the same for every image token: the softmax drops them), output ``A image
    Wvᵀ + bv`` = ``(A scale) (y Wvᵀ) + ((A coeff) basis) Wvᵀ + bias Wvᵀ + bv``."""
    scale, coeff, basis, bias = keys
    b, t, _ = q_in.shape
    heads = attn.num_heads
    q, folded = _fold(attn.q_proj(q_in), attn.k_proj.weight, heads, b)  # (heads, b t, d)
    m = coeff.shape[-1]
    pooled = cn.ops.point_pool(scale, coeff, folded @ basis.swapaxes(1, 2), shared[0],
                               pe_keys, q, shared[1])  # (b, r, m + d)
    wv = attn.v_proj.weight
    # ((A coeff) basis) Wvᵀ head by head: r rows through the value projection, not basis's m
    mixed = (pooled[..., :m] @ basis).reshape(b, heads, t, -1).transpose(1, 0, 2, 3)
    values = mixed.reshape(heads, b * t, -1) @ head_weights(wv, heads).swapaxes(1, 2)
    out = (pooled[..., m:].reshape(b, heads, t, -1)
           + values.reshape(heads, b, t, -1).transpose(1, 0, 2, 3))  # (b, heads, t, d)
    out = out + (bias @ wv.T + attn.v_proj.bias).reshape(heads, 1, -1)
    return attn.out_proj(out.transpose(0, 2, 1, 3).reshape(b, t, -1))


def _values_through_output(attn: "Attention", v: mx.array, b: int) -> mx.array:
    """The tokens' values ``v (heads, b t, d)`` through the output projection, per head:
    ``(b, heads t, c)``, row ``h t + j`` = ``v_j`` of head ``h`` @ that head's rows of
    ``Woᵀ``, plus ``bo / heads`` (each head's attention weights sum to 1, so a product with
    them adds ``bo`` once)."""
    heads = attn.num_heads
    wo = attn.out_proj.weight.T  # (heads d, c)
    out = _per_prompt(v @ wo.reshape(heads, -1, wo.shape[-1]), b)
    return out + attn.out_proj.bias / heads


def _gram(rows: mx.array) -> mx.array:
    """``rows (b, m, c)`` → ``rows rowsᵀ (b, m, m)``."""
    return rows @ rows.swapaxes(1, 2)


def _heads(x: mx.array, heads: int) -> mx.array:
    """``(..., rows, heads * d)`` projections → ``(heads, rows, d)`` (leading axes merged)."""
    rows = math.prod(x.shape[:-1])
    return x.reshape(rows, heads, -1).transpose(1, 0, 2)


def _scaled_heads(x: mx.array, heads: int) -> mx.array:
    """:func:`_heads`, times the attention scale ``1 / sqrt(d)``."""
    x = _heads(x, heads)
    return x * (1.0 / math.sqrt(x.shape[-1]))


def _fold(x: mx.array, weight: mx.array, heads: int, b: int) -> tuple[mx.array, mx.array]:
    """The token side of an attention folded into the image side's projection weight
    ``(heads d, c)``: the tokens' projections ``x (b, t, heads d)`` as scaled heads
    ``(heads, b t, d)``, and per prompt, head by head, their products with that head's rows of
    the weight ``(b, heads t, c)``."""
    x = _scaled_heads(x, heads)
    return x, _per_prompt(x @ head_weights(weight, heads), b)


def _per_prompt(x: mx.array, b: int) -> mx.array:
    """``(heads, b t, c)`` → ``(b, heads t, c)``: each prompt's rows, head by head."""
    heads, bt, c = x.shape
    return x.reshape(heads, b, bt // b, c).transpose(1, 0, 2, 3).reshape(b, -1, c)


def _blocks_as_linear(conv: "ConvTranspose2d") -> tuple[mx.array, mx.array]:
    """A transposed conv whose stride is its kernel, as the weight ``(kh kw out, in)`` and bias
    of a Linear from each input pixel to its ``kh x kw`` block of output pixels."""
    out, kh, kw, cin = conv.weight.shape
    if conv.config.stride not in ((kh, kw), kh) or conv.config.padding not in (0, (0, 0)):
        raise ValueError(f"a {kh}x{kw} transposed conv of stride {conv.config.stride} and "
                         f"padding {conv.config.padding} is not one block per input pixel")
    weight = conv.weight.transpose(1, 2, 0, 3).reshape(kh * kw * out, cin)
    return weight, mx.tile(conv.get("bias"), kh * kw)
