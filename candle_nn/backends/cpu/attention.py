"""The compiled attention kernels (csrc/attention.cpp) and attention on the softmax kernel.

MLX limitation: CPU attention of short sequences (TinyViT's windows, SAM's decoder tokens) is a
transpose and split copies, per-matrix sgemm calls on one thread, a broadcast bias add and a
transpose back; here one (sequence, head) per task, q/k^T/v in L1 scratch, register-tiled
products, the output in the layout the next projection takes (an image's windows: read from and
written to the image in place, no partition / merge copies). MLX's CPU
``scaled_dot_product_attention`` is matmul + softmax + matmul with the softmax on one thread:
``sdpa_softmax`` is the same with the softmax kernel.
"""

from __future__ import annotations

import mlx.core as mx

from ...ops.activation import softmax
from ...ops.registry import register
from . import kernels


def _packed_applies(qkv, heads, scale, bias) -> bool:
    if not kernels.float32_cpu(qkv.dtype) or qkv.ndim != 3 or qkv.shape[-1] % (3 * heads):
        return False
    return bias is None or (bias.dtype == mx.float32
                            and bias.shape == (heads, qkv.shape[1], qkv.shape[1]))


@register("packed_qkv_attention", "attention_packed", "cpu", applies=_packed_applies,
          available=kernels.loaded,
          works_around="CPU attention of short sequences: copies and one-thread sgemm calls")
def attention_packed(qkv, heads, scale, bias):
    kernels.sync_threads()
    return kernels.module().attention_packed(qkv, bias, heads, scale)


def _window_applies(qkv, heads, window, scale, bias, pad) -> bool:
    if not kernels.float32_cpu(qkv.dtype) or qkv.ndim != 4 or qkv.shape[-1] % (3 * heads) \
            or window < 1 or not hasattr(kernels.module(), "window_attention"):
        return False
    return (bias is None or (bias.dtype == mx.float32
                             and bias.shape == (heads, window * window, window * window))) \
        and (pad is None or (pad.dtype == mx.float32 and pad.shape == (qkv.shape[-1],)))


@register("window_attention", "attention_window", "cpu", applies=_window_applies,
          available=kernels.loaded,
          works_around="an image cut into windows and back is single-threaded strided copies")
def attention_window(qkv, heads, window, scale, bias, pad):
    kernels.sync_threads()
    return kernels.module().window_attention(qkv, pad, bias, heads, window, scale)


def _heads_applies(q, k, v, heads, scale) -> bool:
    if not kernels.float32_cpu(q.dtype) or k.dtype != q.dtype or v.dtype != q.dtype:
        return False
    return not (q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or q.shape[0] != k.shape[0]
                or k.shape[:2] != v.shape[:2] or q.shape[2] != k.shape[2]
                or q.shape[2] % heads or v.shape[2] % heads or k.shape[1] == 0)


@register("multi_head_attention", "attention_heads", "cpu", applies=_heads_applies,
          available=kernels.loaded,
          works_around="CPU attention: transposes to (B, heads, L, D) and back, one-thread sgemm")
def attention_heads(q, k, v, heads, scale):
    kernels.sync_threads()
    return kernels.module().attention_heads(q, k, v, heads, scale)


def _sdpa_applies(q, k, v, scale, mask) -> bool:
    return (kernels.float32_cpu(q.dtype) and k.dtype == v.dtype == q.dtype
            and q.shape[1] == k.shape[1])


@register("scaled_dot_product_attention", "sdpa_softmax", "cpu", applies=_sdpa_applies,
          available=kernels.loaded, grad="mlx",
          works_around="the CPU attention's softmax runs on one thread")
def sdpa(q, k, v, scale, mask):
    scores = (q * scale) @ k.swapaxes(-1, -2)
    if mask is not None:
        scores = (mx.where(mask, scores, mx.finfo(scores.dtype).min)
                  if mask.dtype == mx.bool_ else scores + mask)
    return softmax(scores) @ v
