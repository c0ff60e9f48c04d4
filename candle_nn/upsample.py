"""Nearest-neighbour and bilinear upsampling of NHWC tensors."""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def upsample_nearest2d(x: mx.array, height: int, width: int) -> mx.array:
    """Resize ``(N, H, W, C)`` to ``(N, height, width, C)`` by nearest neighbour.

    Source index is ``floor(dst * in / out)``, PyTorch's ``mode="nearest"`` (and candle's) rule,
    evaluated like PyTorch's kernel with a float32 scale, so the indices match PyTorch's (checked
    for all sizes up to 80 -> 400; candle uses float64, which differs for a few, e.g. 4 -> 82).
    Integer scale factors take an exact broadcast fast path.
    """
    n, h, w, c = x.shape
    if height % h == 0 and width % w == 0:
        sh, sw = height // h, width // w
        x = mx.broadcast_to(x[:, :, None, :, None, :], (n, h, sh, w, sw, c))
        return x.reshape(n, height, width, c)
    rows = mx.floor(mx.arange(height) * (h / height)).astype(mx.int32)
    cols = mx.floor(mx.arange(width) * (w / width)).astype(mx.int32)
    return mx.take(mx.take(x, rows, axis=1), cols, axis=2)


def _linear_taps(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source indices ``i0``, ``i1`` and the weight of ``i1`` for each output position.

    PyTorch's ``align_corners=False`` rule, in float32 as its CPU kernel:
    ``src = max((dst + 0.5) * in / out - 0.5, 0)``, ``i0 = floor(src)``,
    ``i1 = min(i0 + 1, in - 1)``, weight ``src - i0``.
    """
    scale = np.float32(size_in / size_out)
    src = (np.arange(size_out, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    src = np.maximum(src, np.float32(0.0))
    i0 = np.minimum(np.floor(src).astype(np.int32), size_in - 1)
    i1 = np.minimum(i0 + 1, size_in - 1)
    return i0, i1, (src - i0).astype(np.float32)


def upsample_bilinear2d(x: mx.array, height: int, width: int) -> mx.array:
    """Resize ``(N, H, W, C)`` to ``(N, height, width, C)`` by bilinear interpolation.

    Same values as PyTorch's ``F.interpolate(x, (height, width), mode="bilinear",
    align_corners=False)`` without antialiasing (also when shrinking: each output pixel blends
    its two nearest source pixels per axis, whatever the scale). The taps depend only on the
    shapes and are computed on the host; the blend runs on the caller's stream, rows then columns.
    """
    n, h, w, c = x.shape
    dtype = x.dtype
    if (h, w) == (height, width):
        return x
    r0, r1, rw = _linear_taps(h, height)
    c0, c1, cw = _linear_taps(w, width)
    rw = mx.array(rw).astype(dtype).reshape(1, height, 1, 1)
    cw = mx.array(cw).astype(dtype).reshape(1, 1, width, 1)
    top = mx.take(x, mx.array(r0), axis=1)
    bottom = mx.take(x, mx.array(r1), axis=1)
    x = top * (1 - rw) + bottom * rw
    left = mx.take(x, mx.array(c0), axis=2)
    right = mx.take(x, mx.array(c1), axis=2)
    return left * (1 - cw) + right * cw


def bilinear_resize_matrix(size_in: int, size_out: int, keep: int | None = None) -> np.ndarray:
    """The bilinear resize of one axis as a ``(keep, size_in)`` float64 matrix ``R``: ``R @ v``
    resizes ``v`` to ``size_out`` positions (the taps of :func:`upsample_bilinear2d`) and keeps the
    first ``keep`` (default: all). Products of such matrices turn a chain of resizes and crops
    (SAM's masks: to 1024², crop the padding, to the image size) into one matmul per axis."""
    keep = size_out if keep is None else keep
    i0, i1, weight = (t[:keep] for t in _linear_taps(size_in, size_out))
    matrix = np.zeros((keep, size_in))
    rows = np.arange(keep)
    np.add.at(matrix, (rows, i0), 1.0 - weight.astype(np.float64))
    np.add.at(matrix, (rows, i1), weight.astype(np.float64))
    return matrix
