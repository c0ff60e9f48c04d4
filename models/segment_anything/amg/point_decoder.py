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

The per-prompt image-side work goes through candle_nn's ops ``point_pool`` / ``point_spread``
(the attention, with the positional scores, softmax, residual and LayerNorm fused) and
``mask_upscale`` (the output upscaling): on the CPU compiled kernels, one prompt's products per
task on the thread pool; elsewhere their plain-MLX references. On GPUs :meth:`decode` runs
under ``mx.compile``.

Shapes: the image grid is ``n = 64 * 64`` tokens of ``c = 256``; a batch has ``b`` prompts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import candle_nn as cn
import mlx.core as mx
import numpy as np

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
                 compiled: bool | None = None) -> None:
        if image_embeddings.shape[0] != 1:
            raise ValueError(f"one image embedding at a time, not {image_embeddings.shape[0]}")
        self.sam = sam
        pe, md = sam.prompt_encoder, sam.mask_decoder
        _, h, w, c = image_embeddings.shape
        self.grid = (h, w)
        with sam.on_device():
            dense = pe.no_mask_embed.embeddings.reshape(1, 1, 1, -1)
            keys0 = (image_embeddings + dense).reshape(1, h * w, c)
            key_pe = pe.get_dense_pe().reshape(1, h * w, c).astype(keys0.dtype)
            (first, second), last = md.transformer.layers, md.transformer.final_attn_token_to_image
            t2i, i2t = first.cross_attn_token_to_image, first.cross_attn_image_to_token
            # The first block's image side, whole; later blocks' image tokens change per prompt,
            # but their positional encoding's share of the scores does not.
            self.image_side = {
                "keys0": keys0,
                "first_keys": _heads(t2i.k_proj(keys0 + key_pe), t2i.num_heads),  # (heads, n, d)
                "first_values": _heads(t2i.v_proj(keys0), t2i.num_heads),
                "first_queries": _heads(i2t.q_proj(keys0 + key_pe), i2t.num_heads),
                "pe_keys": [_heads(key_pe @ attn.k_proj.weight.T, attn.num_heads)
                            for attn in (second.cross_attn_token_to_image, last)],
                "pe_queries": _heads(second.cross_attn_image_to_token.q_proj(key_pe),
                                     i2t.num_heads),
            }
            mx.eval(self.image_side)
        if compiled is None:
            compiled = sam.device is not None and sam.device.kind == "gpu"
        self.compiled = compiled
        self._upscaling: tuple[tuple[mx.array, mx.array], ...] | None = None

    def decode(self, coords: mx.array) -> tuple[mx.array, tuple[mx.array, mx.array]]:
        """``coords (b, 2)`` point ``(x, y)`` in the 1024 input frame → predicted IoUs
        ``(b, 3)`` and the state :meth:`masks` needs: the image tokens after the transformer
        ``(b, n, c)`` and the three masks' hypernetwork vectors ``(b, 3, c / 8)``.

        Under ``mx.compile`` where ``compiled`` (by default on GPUs): one trace per batch size
        and model, the image side an input (on the CPU the kernels beat MLX's compiled code)."""
        with self.sam.on_device():
            if not self.compiled:
                return _decode(self.sam, coords, self.image_side)
            cache = self.sam.__dict__.setdefault("_point_grid_decode", {})
            fn = cache.get(repr(self.sam.device))  # traced on that device's stream
            if fn is None:
                sam = self.sam
                fn = cache[repr(sam.device)] = mx.compile(lambda c, side: _decode(sam, c, side))
            return fn(coords, self.image_side)

    def masks(self, state: tuple[mx.array, mx.array], prompts: np.ndarray,
              which: np.ndarray) -> mx.array:
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
            per_prompt = mx.concatenate([
                self._upscale(keys[mx.array(part)], hyper[mx.array(part)])
                for part in np.array_split(unique, -(-len(unique) // self.chunk))], axis=0)
            rows = mx.array(inverse.reshape(-1) * per_prompt.shape[1] + which)
            x = per_prompt.reshape(-1, h * w * 16)[rows]  # (k, n 16), block layout
            return self.sam.mask_decoder.blocks_to_image(x, (h, w))

    def _upscale(self, keys: mx.array, hyper: mx.array) -> mx.array:
        """``keys (u, n, c)``, ``hyper (u, 3, c/8)`` → the three masks of each prompt in block
        layout ``(u, 3, n, 16)``."""
        md = self.sam.mask_decoder
        if self._upscaling is None:
            self._upscaling = tuple(_blocks_as_linear(conv) for conv in
                                    (md.output_upscaling_conv1, md.output_upscaling_conv2))
        (w1, b1), (w2, b2) = self._upscaling
        ln = md.output_upscaling_ln
        return cn.ops.mask_upscale(keys, w1, b1, ln.weight, ln.bias, ln.config.eps, w2, b2, hyper)


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
    return cn.ops.point_spread(side["keys0"], None, side["first_queries"], k,
                               _values_through_output(attn, v_in), *_ln(norm))


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
    return cn.ops.point_spread(image, folded, side["pe_queries"], k,
                               _values_through_output(attn, v_in), *_ln(norm))


def _values_through_output(attn: "Attention", v_in: mx.array) -> mx.array:
    """The tokens' values through the output projection, per head: ``(b, heads t, c)``,
    row ``h t + j`` = ``v_j`` of head ``h`` @ that head's rows of ``Woᵀ``, plus
    ``bo / heads`` (each head's attention weights sum to 1, so a product with them adds
    ``bo`` once)."""
    b, t, _ = v_in.shape
    heads = attn.num_heads
    v = _heads(attn.v_proj(v_in), heads)  # (heads, b t, d)
    wo = attn.out_proj.weight.T  # (heads d, c)
    out = _per_prompt(v @ wo.reshape(heads, -1, wo.shape[-1]), b)
    return out + attn.out_proj.bias / heads


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
