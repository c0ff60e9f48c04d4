"""Attention ops: scaled dot-product attention and two multi-head layouts."""

from __future__ import annotations

import math

import mlx.core as mx

from .registry import op


@op("scaled_dot_product_attention")
def _sdpa(q: mx.array, k: mx.array, v: mx.array, scale: float,
          mask: mx.array | None) -> mx.array:
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def scaled_dot_product_attention(q: mx.array, k: mx.array, v: mx.array, *,
                                 scale: float | None = None,
                                 mask: mx.array | None = None) -> mx.array:
    """``softmax(q @ k.T * scale + mask) @ v``.

    Shapes: ``q`` ``(B, heads, Lq, D)``, ``k`` ``(B, heads, Lk, D)``, ``v`` ``(B, heads, Lk, Dv)``;
    ``mask`` broadcastable to ``(B, heads, Lq, Lk)`` (an additive float bias or a boolean
    keep-mask).
    ``scale`` defaults to ``1 / sqrt(D)``. Returns ``(B, heads, Lq, Dv)``.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if mask is not None and mask.dtype != mx.bool_:
        mask = mask.astype(q.dtype)
    return _sdpa(q, k, v, scale, mask)


@op("packed_qkv_attention")
def _packed_qkv_attention(qkv: mx.array, heads: int, scale: float,
                          bias: mx.array | None) -> mx.array:
    b, n, width = qkv.shape
    d = width // (3 * heads)
    q, k, v = mx.split(qkv.reshape(b, n, heads, 3 * d).transpose(0, 2, 1, 3), 3, axis=-1)
    out = scaled_dot_product_attention(q, k, v, scale=scale,
                                       mask=None if bias is None else bias[None])
    return out.transpose(0, 2, 1, 3).reshape(b, n, heads * d)


def packed_qkv_attention(qkv: mx.array, heads: int, *, scale: float | None = None,
                         bias: mx.array | None = None) -> mx.array:
    """Multi-head attention straight from a packed projection: per token and head, ``q``, ``k``
    and ``v`` of ``D`` features each (TinyViT's ``qkv`` layout, ``heads * 3 * D`` in all).

    Shapes: ``qkv`` ``(B, N, heads * 3 * D)``, ``bias`` ``(heads, N, N)`` (added to the scores)
    or ``None``; returns ``(B, N, heads * D)`` (heads concatenated, ready for the output
    projection). ``scale`` defaults to ``1 / sqrt(D)``.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(qkv.shape[-1] // (3 * heads))
    return _packed_qkv_attention(qkv, heads, scale, bias)


def window_partition(x: mx.array, window: int, fill: mx.array | None = None) -> mx.array:
    """``(B, H, W, C)`` → ``(B * nH * nW, window², C)``: the image padded at the bottom / right
    to whole windows with the row ``fill`` ``(C,)`` (zeros when ``None``) and cut into windows,
    row-major inside each window and over the windows."""
    b, h, w, c = x.shape
    hp, wp = -(-h // window) * window, -(-w // window) * window
    if fill is None:
        x = mx.pad(x, [(0, 0), (0, hp - h), (0, wp - w), (0, 0)]) if hp != h or wp != w else x
    else:
        fill = fill.astype(x.dtype)
        if wp != w:
            x = mx.concatenate([x, mx.broadcast_to(fill, (b, h, wp - w, c))], axis=2)
        if hp != h:
            x = mx.concatenate([x, mx.broadcast_to(fill, (b, hp - h, wp, c))], axis=1)
    x = x.reshape(b, hp // window, window, wp // window, window, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window * window, c)


def window_merge(windows: mx.array, b: int, h: int, w: int, window: int) -> mx.array:
    """Inverse of :func:`window_partition`: ``(b * nH * nW, window², C)`` → ``(b, h, w, C)``,
    the padding cropped."""
    nh, nw, c = -(-h // window), -(-w // window), windows.shape[-1]
    x = windows.reshape(b, nh, nw, window, window, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, nh * window, nw * window, c)[:, :h, :w, :]


@op("window_attention")
def _window_attention(qkv: mx.array, heads: int, window: int, scale: float,
                      bias: mx.array | None, pad: mx.array | None) -> mx.array:
    b, h, w, _ = qkv.shape
    out = packed_qkv_attention(window_partition(qkv, window, pad), heads, scale=scale, bias=bias)
    return window_merge(out, b, h, w, window)


def window_attention(qkv: mx.array, heads: int, window: int, *, scale: float | None = None,
                     bias: mx.array | None = None, pad: mx.array | None = None) -> mx.array:
    """Attention inside ``window`` x ``window`` tiles of an image, straight from its packed
    projection in image order (TinyViT's blocks): :func:`packed_qkv_attention` of every window,
    without cutting the image into windows and back.

    Shapes: ``qkv`` ``(B, H, W, heads * 3 * D)`` (per token and head ``q``, ``k``, ``v`` of ``D``
    each); H, W need not be multiples of ``window``: the tiles past the bottom / right edge are
    filled with ``pad`` ``(heads * 3 * D,)``, the projection of a padding token (zeros when
    ``None``), which only serve as keys and values; ``bias`` ``(heads, window², window²)`` (added
    to the scores, tokens numbered row-major inside a window) or ``None``. Returns
    ``(B, H, W, heads * D)`` in image order. ``scale`` defaults to ``1 / sqrt(D)``.
    """
    if qkv.ndim != 4 or heads < 1 or qkv.shape[-1] % (3 * heads) or window < 1:
        raise ValueError(
            f"window_attention: qkv {tuple(qkv.shape)}, heads {heads}, window {window}: expected "
            "qkv (B, H, W, heads * 3 * D), heads >= 1 and window >= 1")
    if pad is not None and pad.shape != (qkv.shape[-1],):
        raise ValueError(f"window_attention: pad {tuple(pad.shape)} must be one qkv row "
                         f"({qkv.shape[-1]},), the projection of a padding token")
    if scale is None:
        scale = 1.0 / math.sqrt(qkv.shape[-1] // (3 * heads))
    return _window_attention(qkv, heads, window, scale, bias, pad)


@op("multi_head_attention")
def _multi_head_attention(q: mx.array, k: mx.array, v: mx.array, heads: int,
                          scale: float) -> mx.array:
    def split(x: mx.array) -> mx.array:
        return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(0, 2, 1, 3)

    out = scaled_dot_product_attention(split(q), split(k), split(v), scale=scale)
    return out.transpose(0, 2, 1, 3).reshape(q.shape[0], q.shape[1], -1)


def multi_head_attention(q: mx.array, k: mx.array, v: mx.array, heads: int, *,
                         scale: float | None = None) -> mx.array:
    """``softmax(q k^T * scale) v`` per head, with the heads side by side in the last axis (the
    layout the q/k/v projections give and the output projection takes).

    Shapes: ``q`` ``(B, Lq, heads * D)``, ``k`` ``(B, Lk, heads * D)``, ``v`` ``(B, Lk, heads *
    Dv)``; returns ``(B, Lq, heads * Dv)``. ``scale`` defaults to ``1 / sqrt(D)``.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1] // heads)
    return _multi_head_attention(q, k, v, heads, scale)
