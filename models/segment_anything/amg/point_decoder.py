"""``PointGridDecoder``: SAM's prompt encoder + mask decoder for many single-point prompts
against one image embedding, the way automatic mask generation asks (one foreground point per
prompt, no box, no mask input, three masks each).

The same function as ``Sam.forward(features, (coords, ones), multimask_output=True)``, computed
in another order (equal within float32 rounding):

* everything about the image that no prompt changes — the no-mask dense embedding added to the
  image embedding, the positional encoding, and the first block's image-side projections (the
  keys and values of tokens → image attention, the queries of image → tokens attention) — is
  computed once per image in the constructor;
* attention between the 7 prompt tokens and the 4096 image tokens never projects the image side
  per prompt: the token side is folded into the projection weights instead
  (``(x Wk) qᵀ = x (Wk qᵀ)``, ``A (x Wv) = (A x) Wv``), and image → tokens attention applies
  its output projection to the 7 tokens' values before the 4096-row product (``P (V Wo)``):
  inner dimensions of 56 (8 heads x 7 tokens) where the direct order has 256 or 128;
* :meth:`decode` stops at the tokens: predicted IoUs and the masks' hypernetwork vectors; the
  output upscaling (most of the remaining work) runs in :meth:`masks` only for the prompts and
  masks the caller keeps (those that pass the predicted-IoU filter).

The image tokens after each block take one of two forms (``factored``, by default on GPUs):

* whole, ``(b, n, c)`` per prompt: the per-prompt image-side work goes through candle_nn's ops
  ``point_pool`` / ``point_spread`` (the attention, with the positional scores, softmax,
  residual and LayerNorm fused) and ``mask_upscale`` (the output upscaling): on the CPU
  compiled kernels, one prompt's products per task on the thread pool; elsewhere their
  plain-MLX references (the CPU's default);
* factored, never materialised: after the first block ``scale y1 + coeff basis + bias`` and
  after the second ``scale y2 + coeff basis + bias``, ``y1``, ``y2 (n, c)`` shared rows of
  the image side (``keys0`` centred times LayerNorm weights), ``scale (b, n)`` the
  LayerNorms' per-row ``1 / std``, ``coeff (b, n, m)`` and ``basis (b, m, c)`` per prompt
  (``m = 56`` after the first block: the attention probabilities and the tokens' values
  through the output projection; ``m = 113`` after the second: both blocks' and the first
  LayerNorm's bias). Every use of the image tokens is then a product with the shared rows,
  once per image (``y Wkᵀ``, ``y Wvᵀ``, ``y W1ᵀ`` of the upscaling's first transposed conv)
  plus one with the ``m`` columns per prompt; the LayerNorms' row statistics come from
  centred forms (``|z + u B|² = |z|² + 2 u (z Bᵀ) + u (B Bᵀ) uᵀ``, ``z Bᵀ`` through the
  image side's products with the output projections). Per prompt about 207 M multiply-adds
  for the tokens where whole rows take 411 M, and 253 M for a kept prompt's upscaling where
  they take 402 M; the products with the shared rows are one GEMM for all prompts. All
  plain MLX (on the CPU slower than the kernels of the whole form: MLX's small batched
  products and transposes, no fusion).

On GPUs :meth:`decode` runs under ``mx.compile``.

Shapes: the image grid is ``n = 64 * 64`` tokens of ``c = 256``; a batch has ``b`` prompts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import candle_nn as cn
import mlx.core as mx
import numpy as np

from candle_nn.ops.mask_upscale import upscale_blocks

from ..transformer import head_weights

if TYPE_CHECKING:
    from candle_nn import ConvTranspose2d, LayerNorm

    from ..sam import Sam
    from ..transformer import Attention

MULTIMASK = slice(1, 4)  # SAM's multimask output: mask tokens 1..3 (token 0 is the single mask)


class PointGridDecoder:
    """Single-point prompts against one image embedding ``(1, h, w, c)`` (NHWC)."""

    chunk = 16  # prompts upscaled together by :meth:`masks` (as MLX ops: ~25 MB a prompt)

    def __init__(self, sam: "Sam", image_embeddings: mx.array, compiled: bool | None = None,
                 factored: bool | None = None) -> None:
        if image_embeddings.shape[0] != 1:
            raise ValueError(f"one image embedding at a time, not {image_embeddings.shape[0]}")
        self.sam = sam
        pe = sam.prompt_encoder
        _, h, w, c = image_embeddings.shape
        self.grid = (h, w)
        on_gpu = sam.device is not None and sam.device.kind == "gpu"
        self.compiled = on_gpu if compiled is None else compiled
        self.factored = on_gpu if factored is None else factored
        with sam.on_device():
            dense = pe.no_mask_embed.embeddings.reshape(1, 1, 1, -1)
            keys0 = (image_embeddings + dense).reshape(h * w, c)
            key_pe = pe.get_dense_pe().reshape(h * w, c).astype(keys0.dtype)
            self.image_side = (_factored_side if self.factored else _side)(sam, keys0, key_pe)
            mx.eval(self.image_side)
        self._upscaling: tuple[tuple[mx.array, mx.array], ...] | None = None

    def decode(self, coords: mx.array) -> tuple[mx.array, tuple]:
        """``coords (b, 2)`` point ``(x, y)`` in the 1024 input frame → predicted IoUs
        ``(b, 3)`` and the state :meth:`masks` needs: the image tokens after the transformer
        (``(b, n, c)``, or factored: ``scale (b, n)``, ``coeff (b, n, m)``, ``basis (b, m,
        c)``) and the three masks' hypernetwork vectors ``(b, 3, c / 8)``.

        Under ``mx.compile`` where ``compiled`` (by default on GPUs): one trace per batch size,
        model and form, the image side an input (on the CPU the kernels beat MLX's compiled
        code)."""
        fn = _factored_decode if self.factored else _decode
        with self.sam.on_device():
            if not self.compiled:
                return fn(self.sam, coords, self.image_side)
            cache = self.sam.__dict__.setdefault("_point_grid_decode", {})
            key = (repr(self.sam.device), self.factored)  # traced on that device's stream
            if key not in cache:
                sam = self.sam
                cache[key] = mx.compile(lambda c, side: fn(sam, c, side))
            return cache[key](coords, self.image_side)

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
                per_prompt.append(self._upscale(tuple(k[part] for k in keys) if self.factored
                                                else keys[part], hyper[part]))
            per_prompt = mx.concatenate(per_prompt, axis=0)
            rows = mx.array(inverse.reshape(-1) * per_prompt.shape[1] + which)
            x = per_prompt.reshape(-1, h * w * 16)[rows]  # (k, n 16), block layout
            return self.sam.mask_decoder.blocks_to_image(x, (h, w))

    def _upscale(self, keys: mx.array | tuple, hyper: mx.array) -> mx.array:
        """``keys (u, n, c)`` (or factored, as :meth:`decode` makes them), ``hyper (u, 3,
        c/8)`` → the three masks of each prompt in block layout ``(u, 3, n, 16)``. Factored,
        the first Linear of the image tokens is ``scale (y2 W1ᵀ) + coeff (basis W1ᵀ) + (LN
        bias) W1ᵀ + b1``, ``y2 W1ᵀ`` from the image side."""
        md = self.sam.mask_decoder
        if self._upscaling is None:
            self._upscaling = tuple(_blocks_as_linear(conv) for conv in
                                    (md.output_upscaling_conv1, md.output_upscaling_conv2))
        (w1, b1), (w2, b2) = self._upscaling
        ln = md.output_upscaling_ln
        if not self.factored:
            return cn.ops.mask_upscale(keys, w1, b1, ln.weight, ln.bias, ln.config.eps, w2, b2,
                                       hyper)
        scale, coeff, basis = keys
        bias = md.transformer.layers[1].norm4.bias @ w1.T + b1
        x = mx.addmm(scale[..., None] * self.image_side["upscale"] + bias, coeff, basis @ w1.T)
        return upscale_blocks(x, ln.weight, ln.bias, ln.config.eps, w2, b2, hyper)


def _side(sam: "Sam", keys0: mx.array, key_pe: mx.array) -> dict:
    """The image side of :func:`_decode`: the image tokens with the no-mask embedding
    ``keys0 (n, c)``, the positional encoding ``key_pe (n, c)`` → ``keys0 (1, n, c)``, the
    first block's keys and values of tokens → image attention and queries of image → tokens
    attention (whole), later blocks' positional shares, per head ``(heads, n, d)``."""
    md = sam.mask_decoder
    (first, second), last = md.transformer.layers, md.transformer.final_attn_token_to_image
    t2i, i2t = first.cross_attn_token_to_image, first.cross_attn_image_to_token
    return {
        "keys0": keys0[None],
        "first_keys": _heads(t2i.k_proj(keys0 + key_pe), t2i.num_heads),
        "first_values": _heads(t2i.v_proj(keys0), t2i.num_heads),
        "first_queries": _heads(i2t.q_proj(keys0 + key_pe), i2t.num_heads),
        "pe_keys": [_heads(key_pe @ attn.k_proj.weight.T, attn.num_heads)
                    for attn in (second.cross_attn_token_to_image, last)],
        "pe_queries": _heads(second.cross_attn_image_to_token.q_proj(key_pe), i2t.num_heads),
    }


def _factored_side(sam: "Sam", keys0: mx.array, key_pe: mx.array) -> dict:
    """The image side of :func:`_factored_decode` (arguments as :func:`_side`): the shared
    rows' products with the weights that the factored attention and LayerNorms need."""
    md = sam.mask_decoder
    (first, second), last = md.transformer.layers, md.transformer.final_attn_token_to_image
    t2i, i2t = first.cross_attn_token_to_image, first.cross_attn_image_to_token
    t2i2, i2t2 = second.cross_attn_token_to_image, second.cross_attn_image_to_token
    heads = i2t.num_heads
    # The image tokens after each block are factored rows over these shared rows:
    # centred0 (keys0 centred), y1 = centred0 g1, z = y1 centred, y2 = z g2.
    g1, g2 = first.norm4.weight, second.norm4.weight
    centred0 = keys0 - keys0.mean(-1, keepdims=True)
    y1 = centred0 * g1
    z = y1 - y1.mean(-1, keepdims=True)
    y2 = z * g2
    wo1, bo1 = i2t.out_proj.weight, i2t.out_proj.bias
    wo2, bo2 = i2t2.out_proj.weight, i2t2.out_proj.bias

    def proj(x: mx.array, weight: mx.array) -> mx.array:  # (heads, n, d)
        return _heads(x @ weight.T, heads)

    # (n, heads d) products: per head against the prompts' tokens by _per_head
    return {
        # the first block: its image side is the same for every prompt
        "first_keys": _heads(t2i.k_proj(keys0 + key_pe), t2i.num_heads),
        "first_values": _heads(t2i.v_proj(keys0), t2i.num_heads),
        "first_queries": i2t.q_proj(keys0 + key_pe),
        "centred0_sq": (centred0 * centred0).sum(-1),
        "centred0_out": centred0 @ wo1,
        "centred0_bias": centred0 @ bo1,
        # later blocks: the positional encoding's share of the scores
        "pe_keys": [_heads(key_pe @ attn.k_proj.weight.T, attn.num_heads)
                    for attn in (t2i2, last)],
        "pe_queries": i2t2.q_proj(key_pe),
        # the second block, on y1 (and z for its LayerNorm)
        "second_keys": (proj(y1, t2i2.k_proj.weight), proj(y1, t2i2.v_proj.weight)),
        "second_queries": y1 @ i2t2.q_proj.weight.T,
        "z_sq": (z * z).sum(-1),
        "z_g1_out": (z * g1) @ wo1,
        "z_g1_bias": (z * g1) @ bo1 / heads,
        "z_g1_sum": (z * g1).sum(-1),
        "z_out": z @ wo2,
        "z_bias": z @ bo2,
        "z_bias1": z @ first.norm4.bias,
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
    keys = _first_image_to_tokens(first.cross_attn_image_to_token, first.norm4, side,
                                  queries + tokens, queries)

    q = queries + tokens
    queries = second.norm1(queries + second.self_attn(q, q, queries))
    queries = second.norm2(queries + _tokens_to_image(
        second.cross_attn_token_to_image, queries + tokens, keys, side["pe_keys"][0]))
    queries = second.norm3(queries + second.mlp(queries))
    keys = _image_to_tokens(second.cross_attn_image_to_token, second.norm4, side, keys,
                            queries + tokens, queries)

    queries = tr.norm_final_attn(queries + _tokens_to_image(
        tr.final_attn_token_to_image, queries + tokens, keys, side["pe_keys"][1]))
    iou = md.iou_prediction_head(queries[:, 0])[:, MULTIMASK]
    hyper = mx.stack([md.output_hypernetworks_mlps[i](queries[:, 1 + i])
                      for i in range(MULTIMASK.start, MULTIMASK.stop)], axis=1)
    return iou, (keys, hyper)


# -- attention between the prompt tokens and the image tokens ----------------------------------
def _tokens_to_first_image(attn: "Attention", side: dict, q_in: mx.array) -> mx.array:
    """Tokens → image attention of the first block, whose image side is the same for every
    prompt: keys and values from the image side."""
    b, t, _ = q_in.shape
    q = _scaled_heads(attn.q_proj(q_in), attn.num_heads)  # (heads, b t, d)
    probs = cn.softmax(q @ side["first_keys"].swapaxes(1, 2))  # (heads, b t, n)
    out = probs @ side["first_values"]  # (heads, b t, d)
    return attn.out_proj(out.transpose(1, 0, 2).reshape(b, t, -1))


def _first_image_to_tokens(attn: "Attention", norm: "LayerNorm", side: dict, k_in: mx.array,
                           v_in: mx.array) -> mx.array:
    """The first block's image tokens after its image → tokens attention and ``norm``
    (image-side queries from the image side): ``(b, n, c)``."""
    k = _scaled_heads(attn.k_proj(k_in), attn.num_heads)  # (heads, b t, d)
    v = _heads(attn.v_proj(v_in), attn.num_heads)
    return cn.ops.point_spread(side["keys0"], None, side["first_queries"], k,
                               _values_through_output(attn, v, k_in.shape[0]), *_ln(norm))


def _tokens_to_image(attn: "Attention", q_in: mx.array, image: mx.array,
                     pe_keys: mx.array) -> mx.array:
    """Tokens → image attention, keys ``image + PE`` and values ``image`` ``(b, n, c)``:
    scores ``(Wk qᵀ)ᵀ imageᵀ`` plus the PE's share ``q (PE Wkᵀ)ᵀ`` (``pe_keys``, per image;
    ``q``'s dot with ``k``'s bias is the same for every image token, so the softmax drops
    it), output ``(A image) Wvᵀ + bv``."""
    b, t, _ = q_in.shape
    heads = attn.num_heads
    q, folded = _fold(attn.q_proj(q_in), attn.k_proj.weight, heads, b)
    pooled = cn.ops.point_pool(folded, image, pe_keys, q)  # (b, heads t, c)
    pooled = pooled.reshape(b, heads, t, -1).transpose(1, 0, 2, 3).reshape(heads, b * t, -1)
    out = pooled @ head_weights(attn.v_proj.weight, heads).swapaxes(1, 2)  # (heads, b t, d)
    out = out + attn.v_proj.bias.reshape(heads, 1, -1)
    return attn.out_proj(out.transpose(1, 0, 2).reshape(b, t, -1))


def _image_to_tokens(attn: "Attention", norm: "LayerNorm", side: dict, image: mx.array,
                     k_in: mx.array, v_in: mx.array) -> mx.array:
    """``image (b, n, c)`` after its image → tokens attention (queries ``image + PE``) and
    ``norm``: scores ``image (Wq kᵀ)`` plus the PE's and the bias's share ``(PE Wqᵀ + bq)
    kᵀ`` (the image side's ``pe_queries``), output ``P (V Woᵀ) + bo``."""
    k, folded = _fold(attn.k_proj(k_in), attn.q_proj.weight, attn.num_heads, k_in.shape[0])
    v = _heads(attn.v_proj(v_in), attn.num_heads)
    return cn.ops.point_spread(image, folded, side["pe_queries"], k,
                               _values_through_output(attn, v, k_in.shape[0]), *_ln(norm))



# -- the factored form: image tokens as per-prompt factors over shared rows ---------------------
def _factored_decode(sam: "Sam", coords: mx.array, side: dict) -> tuple[mx.array, tuple]:
    """:func:`_decode` with the image tokens as factored rows (see the module docstring)."""
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
    keys, first_values = _factored_first_image_to_tokens(
        first.cross_attn_image_to_token, first.norm4, side, queries + tokens, queries)

    q = queries + tokens
    queries = second.norm1(queries + second.self_attn(q, q, queries))
    queries = second.norm2(queries + _factored_tokens_to_image(
        second.cross_attn_token_to_image, queries + tokens, keys, side["second_keys"],
        side["pe_keys"][0]))
    queries = second.norm3(queries + second.mlp(queries))
    keys = _factored_image_to_tokens(second.cross_attn_image_to_token, second.norm4, side, keys,
                            first_values, queries + tokens, queries)

    queries = tr.norm_final_attn(queries + _factored_tokens_to_image(
        tr.final_attn_token_to_image, queries + tokens, keys, side["final_keys"],
        side["pe_keys"][1]))
    iou = md.iou_prediction_head(queries[:, 0])[:, MULTIMASK]
    hyper = mx.stack([md.output_hypernetworks_mlps[i](queries[:, 1 + i])
                      for i in range(MULTIMASK.start, MULTIMASK.stop)], axis=1)
    return iou, (keys[:3], hyper)


def _factored_first_image_to_tokens(attn: "Attention", norm: "LayerNorm", side: dict,
                                    k_in: mx.array, v_in: mx.array) -> tuple[tuple, tuple]:
    """The first block's image tokens after its image → tokens attention and ``norm``, as
    factored rows ``(scale, coeff, basis, bias)`` (see :func:`_factored_rows`) over the shared
    rows ``centred0 * g``, and the values ``(v, mean)`` the second block's LayerNorm needs.

    ``LN(keys0 + P V)``: the scores are the image side's queries (``first_queries``) alone,
    ``P (b, n, r)``; with ``V`` row-centred, ``keys0 + P V`` centred is ``centred0 + P Vc``,
    whose squared norm is ``|centred0|² + 2 P (centred0 Vᵀ) + P (Vc Vcᵀ) Pᵀ`` per row, and
    ``centred0 Vᵀ`` is ``(centred0 Wo)`` (image side) times each head's values."""
    b = k_in.shape[0]
    heads = attn.num_heads
    k = _scaled_heads(attn.k_proj(k_in), heads)  # (heads, b t, d)
    v = _heads(attn.v_proj(v_in), heads)
    probs = _softmax_heads(_per_head(side["first_queries"], k, b), heads)
    values = _values_through_output(attn, v, b)  # (b, r, c)
    mean = values.mean(-1)  # (b, r)
    centred = values - mean[..., None]
    cross = (probs * _per_head(side["centred0_out"], v, b)).sum(-1)
    cross = cross + side["centred0_bias"]  # each head's probabilities sum to 1
    quad = ((probs @ (centred @ centred.swapaxes(1, 2))) * probs).sum(-1)
    scale = _rsqrt_var(side["centred0_sq"] + 2 * cross + quad, norm)
    return ((scale, scale[..., None] * probs, centred * norm.weight, norm.bias),
            (v, mean))


def _factored_image_to_tokens(attn: "Attention", norm: "LayerNorm", side: dict, keys: tuple,
                     first_values: tuple, k_in: mx.array, v_in: mx.array) -> tuple:
    """The second block's image tokens (``keys``, the first block's factored rows) after its
    image → tokens attention and ``norm``, factored over the shared rows ``z * g2``.

    ``keys`` centred is ``scale z + coeff basisc + biasc`` (``z`` the image side's centred
    ``centred0 * g1``, ``c`` row-centred), so ``keys + P V`` centred is ``scale z + u B`` with
    ``u = [coeff, P, 1] (b, n, m)``, ``B = [basisc; Vc; biasc] (b, m, c)``, ``m = 2 r + 1``;
    its squared norm is ``scale² |z|² + 2 scale u (z Bᵀ) + u (B Bᵀ) uᵀ``, where ``z Bᵀ``
    comes from image-side products with the output projections (``z basisᵀ`` is ``(z g1)
    Vc₁ᵀ``, ``Vc₁`` the first block's centred values)."""
    scale, coeff, basis, bias = keys
    b = k_in.shape[0]
    heads = attn.num_heads
    k, folded = _fold(attn.k_proj(k_in), attn.q_proj.weight, heads, b)
    scores = (scale[..., None] * _per_head(side["second_queries"], k, b)
              + _per_head(side["pe_queries"], k, b)
              + coeff @ (basis @ folded.swapaxes(1, 2)) + (folded @ bias)[:, None])
    probs = _softmax_heads(scores, heads)  # (b, n, r)
    v = _heads(attn.v_proj(v_in), heads)
    values = _values_through_output(attn, v, b)
    v1, mean1 = first_values
    # z · (u B) per row: z basisᵀ + z Vᵀ (z is centred) + z · bias
    z_basis = (_per_head(side["z_g1_out"], v1, b)
               + side["z_g1_bias"][:, None] - side["z_g1_sum"][:, None] * mean1[:, None])
    cross = ((coeff * z_basis).sum(-1)
             + (probs * _per_head(side["z_out"], v, b)).sum(-1)
             + side["z_bias"] + side["z_bias1"])
    rows = mx.concatenate([basis, values, mx.broadcast_to(bias, (b, 1, bias.shape[-1]))], 1)
    rows = rows - rows.mean(-1, keepdims=True)
    u = mx.concatenate([coeff, probs, mx.ones(probs.shape[:2] + (1,), dtype=probs.dtype)], 2)
    quad = ((u @ (rows @ rows.swapaxes(1, 2))) * u).sum(-1)
    inv = _rsqrt_var(scale * scale * side["z_sq"] + 2 * scale * cross + quad, norm)
    return scale * inv, inv[..., None] * u, rows * norm.weight, norm.bias


def _factored_tokens_to_image(attn: "Attention", q_in: mx.array, keys: tuple, shared: tuple,
                     pe_keys: mx.array) -> mx.array:
    """Tokens → image attention, keys ``image + PE`` and values ``image``, the image tokens
    the factored rows ``keys`` over the shared rows ``y`` and ``shared = (y Wkᵀ, y Wvᵀ)``
    per head (image side): scores ``scale (y Wkᵀ) qᵀ + coeff (basis foldedᵀ)`` plus the PE's
    share (``folded = q Wk``; the bias's dot with the folded queries and ``q``'s dot with the
    key bias are the same for every image token: the softmax drops them), output ``A image
    Wvᵀ + bv`` = ``(A scale) (y Wvᵀ) + (A coeff) (basis Wvᵀ) + bias Wvᵀ + bv``."""
    scale, coeff, basis, bias = keys
    b, t, _ = q_in.shape
    heads = attn.num_heads
    shared_keys, shared_values = shared
    q, folded = _fold(attn.q_proj(q_in), attn.k_proj.weight, heads, b)  # (heads, b t, d)
    scores = (scale[:, None] * _heads_to_prompts(q @ shared_keys.swapaxes(1, 2), b)
              + _heads_to_prompts(q @ pe_keys.swapaxes(1, 2), b)
              + (folded @ basis.swapaxes(1, 2)) @ coeff.swapaxes(1, 2))  # (b, r, n)
    probs = cn.softmax(scores)
    wv = attn.v_proj.weight
    out = _prompts_to_heads(probs * scale[:, None], heads) @ shared_values  # (heads, b t, d)
    pooled = (probs @ coeff).reshape(b, heads, t, -1)  # (b, heads, t, m)
    per_head = (basis @ wv.T).reshape(b, basis.shape[1], heads, -1).transpose(0, 2, 1, 3)
    out_rows = pooled @ per_head  # (b, heads, t, d)
    out = out + out_rows.transpose(1, 0, 2, 3).reshape(heads, b * t, -1)
    out = out + (bias @ wv.T + attn.v_proj.bias).reshape(heads, 1, -1)
    return attn.out_proj(out.transpose(1, 0, 2).reshape(b, t, -1))


# -- helpers ----------------------------------------------------------------------------------
def _values_through_output(attn: "Attention", v: mx.array, b: int) -> mx.array:
    """The tokens' values ``v (heads, b t, d)`` through the output projection, per head:
    ``(b, heads t, c)``, row ``h t + j`` = ``v_j`` of head ``h`` @ that head's rows of
    ``Woᵀ``, plus ``bo / heads`` (each head's attention weights sum to 1, so a product with
    them adds ``bo`` once)."""
    heads = attn.num_heads
    wo = attn.out_proj.weight.T  # (heads d, c)
    out = _per_prompt(v @ wo.reshape(heads, -1, wo.shape[-1]), b)
    return out + attn.out_proj.bias / heads


def _rsqrt_var(sq: mx.array, norm: "LayerNorm") -> mx.array:
    """``1 / sqrt(var + eps)`` of rows whose centred squared norm is ``sq``."""
    return mx.rsqrt(sq / norm.weight.shape[-1] + norm.config.eps)


def _softmax_heads(scores: mx.array, heads: int) -> mx.array:
    """``(b, n, heads t)`` → softmax over each head's ``t`` tokens, same shape."""
    b, n, r = scores.shape
    return cn.softmax(scores.reshape(b, n, heads, r // heads)).reshape(b, n, r)


def _per_head(shared: mx.array, x: mx.array, b: int) -> mx.array:
    """Per prompt and head, ``shared_h x_hᵀ``: ``shared (n, heads d)`` (each head's ``d``
    columns), ``x (heads, b t, d)`` → ``(b, n, heads t)``. One product for every prompt,
    against ``x`` block-diagonal (``heads`` times the multiply-adds of the per-head products,
    without transposing their ``(heads, n, b t)`` out)."""
    heads, bt, d = x.shape
    t = bt // b
    blocks = (x.reshape(heads, b, t, d).transpose(0, 3, 1, 2)[:, :, :, None]
              * mx.eye(heads, dtype=x.dtype).reshape(heads, 1, 1, heads, 1))
    out = shared @ blocks.reshape(heads * d, -1)  # (n, b heads t)
    return out.reshape(-1, b, heads * t).transpose(1, 0, 2)


def _heads_to_prompts(x: mx.array, b: int) -> mx.array:
    """``(heads, b t, n)`` → ``(b, heads t, n)``."""
    heads, bt, n = x.shape
    return x.reshape(heads, b, bt // b, n).transpose(1, 0, 2, 3).reshape(b, -1, n)


def _prompts_to_heads(x: mx.array, heads: int) -> mx.array:
    """``(b, heads t, n)`` → ``(heads, b t, n)``."""
    b, r, n = x.shape
    return x.reshape(b, heads, r // heads, n).transpose(1, 0, 2, 3).reshape(heads, -1, n)


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


def _ln(norm: "LayerNorm") -> tuple[mx.array, mx.array, float]:
    """A LayerNorm's ``weight``, ``bias`` and ``eps``, as the point ops take them."""
    return norm.weight, norm.bias, norm.config.eps


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
