"""Backend-specific fast paths, in one place: where MLX 0.32.4's backends are slow (or wrong), the
same math in another form. Remove each one when MLX catches up (check the limitation first).

The CPU paths here are taken only when the op runs on the CPU (``mx.default_device() ==
mx.cpu``, as inside ``with Device.on_device()`` of a CPU model) in float32, so GPU results never
change. One switch turns them all off: ``CANDLE_NN_CPU_FAST=0`` in the environment (read at
import) or :func:`set_enabled`: plain MLX ops everywhere. The compiled kernels
(``candle_nn._cpu_kernels``, see cpu_native.py) are the first choice; where they are not built
(a source checkout without ``pip install``, a failed build) the pure-MLX paths below stand in.

==============================  ================================================================
path (MLX 0.32.4)               limitation it works around
==============================  ================================================================
native ``bias_act``             every CPU element-wise op (and ``mx.compile``'s fused kernels)
(:func:`bias_act`, used by      runs on ONE thread, and a conv's bias, residual add and
``Conv2d``/``Linear``'s         activation are separate passes over memory: here they are one
``activation=``/``residual=``)  multithreaded pass (identity, ReLU, SiLU, exact GELU)
native ``conv2d_fused``          the CPU conv is im2col by single-threaded general-stride copies
(:func:`conv2d`, used by        (a zero fill, the padded input, then the patches) before one
``Conv2d`` for groups 1)        sgemm, then the epilogue passes: here a multithreaded im2col
                                (none for 1x1 stride 1), the same sgemm, one epilogue pass
native ``attention_packed``     CPU attention of short sequences (TinyViT's windows) is a
(:func:`attention_packed`, used transpose and three split copies, per-matrix sgemm calls on one
by ``packed_qkv_attention``)    thread, a broadcast bias add, a transpose back: here one
                                (sequence, head) per task, q/k^T/v in L1 scratch, register-tiled
                                products, the output in (B, N, heads * D) order
native ``attention_heads``      the same for q, k, v with the heads side by side in the last
(:func:`attention_heads`, used  axis (SAM's decoder: 7 tokens <-> 4096 image tokens), no
by ``multi_head_attention``)    transposes to (B, heads, L, D) and back
native ``linear_rows``          a product of a few rows (SAM's decoder: 7 tokens) goes to the
(:func:`linear_rows`, used by   threaded sgemm, whose threads synchronise several times per
``Linear`` for <= 8 rows)       call (a descheduled one stalls it for a time slice on a busy
                                machine): here dot products over the pool, one join
native ``layer_norm``           ``mx.fast.layer_norm`` runs on one thread on the CPU: here rows
(:func:`layer_norm`, used by    over the thread pool (two passes per row: mean, then the
``LayerNorm``/``LayerNorm2d``)  centred sum of squares)
native ``conv2d_packed``         OpenBLAS re-packs the weights on every sgemm call, and on this
(:func:`conv2d` and             project's AVX-512 machine runs its AVX2 kernel (the environment's
:func:`linear`, used by         ``OPENBLAS_CORETYPE=Haswell``) or a generic AVX-512 one; here the
``Conv2d`` for groups 1 and     weights are packed once per array (:func:`packed_weight`) and
``Linear``; CPUs with           micro-kernels (AVX-512 12x32, else AVX2 6x16) gather the im2col
AVX-512F or AVX2 + FMA, else    blocks themselves and run the epilogue on each tile in cache
the row above / MLX's matmul)   (csrc/gemm.cpp): 1.1-2.3x the BLAS conv's speed per layer, 1
                                thread. ``CANDLE_NN_CPU_GEMM=blas`` (or :func:`set_packed_gemm`)
                                turns it off
native ``softmax_last``         CPU softmax is single-threaded with a scalar ``exp``; used by
(:func:`softmax_last`)          ``softmax`` and by attention on the CPU (MLX's CPU attention is
                                matmul + softmax + matmul anyway)
:func:`silu` without native     ``exp``/``sigmoid`` are scalar libm calls (~15-25 ns/element); a
(``silu_f32``)                  polynomial exp fused by ``mx.compile`` is ~4x faster, 2.2 ulp
:func:`gelu` without native     ``erf`` is a scalar call (MobileSAM's encoder: GELU was about
(``cpu_fast_gelu.gelu_f32``)    half the CPU time); erf from multiply-adds, see cpu_fast_gelu.py
native ``winograd_conv3x3``     the same im2col + sgemm for 3x3 stride-1 convs: 9 multiply-adds
(cpu_winograd.py, used by       per tap; Winograd F(4x4, 3x3) needs 2.25 (36 GEMMs between an
``conv2d`` for 3x3 stride 1)    input and an output transform, the epilogue fused), 2-5x faster
native ``depthwise_conv2d``     grouped convs run a naive scalar loop on one thread: here a
(:func:`depthwise_conv2d_fused`, direct kernel on 8-channel vectors over the thread pool, the
used by ``Conv2d`` when         bias in the accumulators, the epilogue fused per chunk of
groups = channels = outputs)    pixels (any kernel size, stride, padding, dilation)
:func:`depthwise_conv2d`        that loop replaced by ``kH * kW`` shifted multiply-adds fused by
without native                  ``mx.compile`` (2.5-4x faster; still one thread; dilation 1)
==============================  ================================================================

Not switchable, because they are not CPU-only (listed so the inventory is complete): a 1x1
stride-1 ``Conv2d`` is a matmul on every device (conv.py: MLX's CPU conv runs it 1.5-3.5x
slower, same result); ``ConvTranspose2d`` never calls MLX's ``conv_transpose2d`` (conv.py: wrong
on CUDA for strided kernels with overlapping taps); the CUDA kernels and launch settings are in
cuda_kernels.py (``CANDLE_NN_CUDA_KERNELS``) and cuda_launch.py.

``mx.compile`` on the CPU fuses short chains only and stops at float/int bit casts (``view``):
a polynomial exp-based exact GELU tried here ran as ~30 kernels and was ~2x slower than
``mx.erf``, which is why cpu_fast_gelu.py avoids ``exp`` and bit casts.
Without a C++ compiler MLX runs compiled functions unfused: still right, just slower.
Parity of each path with the plain MLX op and float64 is tested in tests/test_cpu_fast.py,
tests/test_cpu_fast_gelu.py and tests/test_cpu_native.py (the compiled kernels and their
fallbacks).
"""

from __future__ import annotations

import functools
import os
import weakref

import mlx.core as mx

from . import cpu_native, cpu_winograd
from .custom_vjp import with_reference_vjp

ENV_VAR = "CANDLE_NN_CPU_FAST"
_enabled = os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "off", "false", "no")


def enabled() -> bool:
    """Whether the CPU fast paths are on (they are by default)."""
    return _enabled


def set_enabled(flag: bool) -> None:
    """Turn every CPU fast path on or off (plain MLX ops when off); for A/B checks and tests."""
    global _enabled
    _enabled = bool(flag)


def native_applies(dtype: mx.Dtype) -> bool:
    """True when the compiled kernels take an op of ``dtype``: :func:`applies`, and loaded."""
    return cpu_native.module() is not None and applies(dtype)


def applies(dtype: mx.Dtype | None = None) -> bool:
    """True when a fast path should run: switched on, the CPU is the current device, and (when
    given) ``dtype`` is float32 (the polynomial paths are tuned for float32)."""
    return _enabled and mx.default_device() == mx.cpu and (dtype is None or dtype == mx.float32)


# -- depthwise conv --------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def depthwise_conv2d(kh: int, kw: int, stride: tuple[int, int], padding: tuple[int, int]):
    """A depthwise conv (one filter per channel) as ``kH * kW`` shifted multiply-adds, fused by
    ``mx.compile``. Returns ``f(x (N, H, W, C), weight (C, kH, kW, 1)) -> (N, H', W', C)``."""
    (sh, sw), (ph, pw) = stride, padding

    def depthwise(x: mx.array, weight: mx.array) -> mx.array:
        n, h, w, c = x.shape
        oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        xp = mx.pad(x, [(0, 0), (ph, ph), (pw, pw), (0, 0)]) if ph or pw else x
        y = None
        for i in range(kh):
            for j in range(kw):
                tap = xp[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :]
                y = tap * weight[:, i, j, 0] if y is None else y + tap * weight[:, i, j, 0]
        return y

    return mx.compile(depthwise)


# -- exp, SiLU, GELU -------------------------------------------------------------------------------
def exp_f32(x: mx.array) -> mx.array:
    """float32 ``exp`` as Cephes' ``expf``: Cody-Waite reduction by ln 2, a degree-6 polynomial,
    and 2**n built in the exponent bits; within 2.2 ulp (MLX's ``x * sigmoid(x)``: 24 ulp)."""
    x = mx.clip(x, -87.3, 88.3)
    n = mx.floor(x * 1.4426950408889634 + 0.5)
    r = x - n * 0.693359375 + n * 2.12194440e-4
    p = r * 1.9875691500e-4 + 1.3981999507e-3
    for c in (8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + c
    two_n = ((n.astype(mx.int32) + 127) << 23).view(mx.float32)
    return (p * (r * r) + r + 1.0) * two_n


# ``x * sigmoid(x)`` for float32 on the CPU (see exp_f32); exp_f32's bit cast (``view``) has no
# VJP, so gradients are those of MLX's own ``x * sigmoid(x)``.
silu_f32 = with_reference_vjp(mx.compile(lambda x: x / (1.0 + exp_f32(-x))),
                              lambda x: x * mx.sigmoid(x))


# -- the compiled kernels (cpu_native.py), with the pure-MLX paths as fallback ---------------------
# act codes of candle_nn._cpu_kernels.bias_act
_ACT_CODES = {None: 0, "identity": 0, "relu": 1, "silu": 2, "swish": 2, "gelu": 3, "gelu_erf": 3}


def bias_act(y: mx.array, bias: mx.array | None, activation: str | None,
             residual: mx.array | None = None, residual_after_activation: bool = False
             ) -> mx.array | None:
    """``activation(y + bias [+ residual])`` (or ``activation(y + bias) + residual``) as one
    multithreaded pass; ``None`` when the compiled kernel does not apply (the caller then runs the
    plain ops). ``y`` ``(..., C)``, ``bias`` ``(C,)``, ``residual`` ``y``'s shape, all float32."""
    if activation not in _ACT_CODES or not native_applies(y.dtype) or y.ndim == 0:
        return None
    if bias is not None and (bias.dtype != mx.float32 or bias.shape != (y.shape[-1],)):
        return None
    if residual is not None and (residual.dtype != mx.float32 or residual.shape != y.shape):
        return None
    code = _ACT_CODES[activation]
    if bias is None and residual is None and code == 0:
        return y
    mode = 0 if residual is None else (2 if residual_after_activation else 1)
    cpu_native.sync_threads()
    return cpu_native.module().bias_act(y, bias, residual, code, mode)


def conv2d(x: mx.array, weight: mx.array, bias: mx.array | None, stride: tuple[int, int],
           padding: tuple[int, int], activation: str | None, residual: mx.array | None = None,
           residual_after_activation: bool = False) -> mx.array | None:
    """A groups-1, dilation-1 conv with its epilogue as one compiled op (im2col + sgemm + one
    pass); ``None`` where it does not apply. ``x`` ``(N, H, W, C)``, ``weight`` ``(O, kH, kW,
    C)``."""
    if activation not in _ACT_CODES or not native_applies(x.dtype):
        return None
    if weight.dtype != mx.float32 or (bias is not None and bias.dtype != mx.float32):
        return None
    if residual is not None and residual.dtype != mx.float32:
        return None
    mode = 0 if residual is None else (2 if residual_after_activation else 1)
    cpu_native.sync_threads()
    # 3x3 stride 1: Winograd F(4x4, 3x3) where it is faster (cpu_winograd.py); the rest on the
    # packed-weight GEMM where this CPU runs it, else im2col + the BLAS's sgemm.
    if cpu_winograd.applies(x.shape, weight.shape, stride, padding):
        y = cpu_winograd.conv3x3(x, weight, bias, padding, _ACT_CODES[activation], residual, mode)
        if y is not None:
            return y
    if packed_gemm_applies():
        out, kh, kw, _ = weight.shape
        return cpu_native.module().conv2d_packed(x, packed_weight(weight), bias, residual,
                                                 (kh, kw), out, stride, padding,
                                                 _ACT_CODES[activation], mode)
    if not cpu_native.has_sgemm():
        return None
    return cpu_native.module().conv2d_fused(x, weight, bias, residual, stride, padding,
                                            _ACT_CODES[activation], mode)


def depthwise_conv2d_fused(x: mx.array, weight: mx.array, bias: mx.array | None,
                           stride: tuple[int, int], padding: tuple[int, int],
                           dilation: tuple[int, int], activation: str | None,
                           residual: mx.array | None = None,
                           residual_after_activation: bool = False) -> mx.array | None:
    """A depthwise conv (groups = channels, one filter each) with its epilogue as one compiled
    op; ``None`` where it does not apply. ``x`` ``(N, H, W, C)``, ``weight`` ``(C, kH, kW, 1)``,
    ``bias`` ``(C,)``, ``residual`` the output's shape."""
    if activation not in _ACT_CODES or not native_applies(x.dtype):
        return None
    if weight.dtype != mx.float32 or (bias is not None and bias.dtype != mx.float32):
        return None
    if residual is not None and residual.dtype != mx.float32:
        return None
    mode = 0 if residual is None else (2 if residual_after_activation else 1)
    cpu_native.sync_threads()
    return cpu_native.module().depthwise_conv2d(x, weight, bias, residual, stride, padding,
                                                dilation, _ACT_CODES[activation], mode)


def attention_packed(qkv: mx.array, heads: int, scale: float,
                     bias: mx.array | None) -> mx.array | None:
    """``softmax(q k^T * scale + bias) v`` per (sequence, head) from ``qkv`` ``(B, N, heads * 3 *
    D)`` (q, k, v per head) by the compiled kernel; ``(B, N, heads * D)``, ``None`` where it
    cannot run."""
    if not native_applies(qkv.dtype) or qkv.ndim != 3 or qkv.shape[-1] % (3 * heads):
        return None
    if bias is not None and (bias.dtype != mx.float32
                             or bias.shape != (heads, qkv.shape[1], qkv.shape[1])):
        return None
    cpu_native.sync_threads()
    return cpu_native.module().attention_packed(qkv, bias, heads, scale)


def attention_heads(q: mx.array, k: mx.array, v: mx.array, heads: int,
                    scale: float) -> mx.array | None:
    """``softmax(q k^T * scale) v`` per (sequence, head), heads side by side in the last axis
    (``q`` ``(B, Lq, heads * D)``, ``k`` ``(B, Lk, heads * D)``, ``v`` ``(B, Lk, heads * Dv)``),
    by the compiled kernel; ``None`` where it cannot run."""
    if not native_applies(q.dtype) or k.dtype != q.dtype or v.dtype != q.dtype:
        return None
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3 or q.shape[0] != k.shape[0] \
            or k.shape[:2] != v.shape[:2] or q.shape[2] != k.shape[2] \
            or q.shape[2] % heads or v.shape[2] % heads or k.shape[1] == 0:
        return None
    cpu_native.sync_threads()
    return cpu_native.module().attention_heads(q, k, v, heads, scale)


LINEAR_ROWS_MAX = 8  # rows up to which linear_rows is no slower than the sgemm (decoder tokens)


def linear_rows(x: mx.array, weight: mx.array, bias: mx.array | None) -> mx.array | None:
    """``x @ weight.T + bias`` for at most :data:`LINEAR_ROWS_MAX` rows by the compiled kernel;
    ``None`` otherwise. ``x`` ``(..., K)``, ``weight`` ``(N, K)``, ``bias`` ``(N,)``."""
    if not native_applies(x.dtype) or x.ndim == 0 or weight.dtype != mx.float32:
        return None
    if x.size > LINEAR_ROWS_MAX * x.shape[-1] or (bias is not None and bias.dtype != mx.float32):
        return None
    cpu_native.sync_threads()
    return cpu_native.module().linear_rows(x, weight, bias)


def layer_norm(x: mx.array, weight: mx.array | None, bias: mx.array | None,
               eps: float) -> mx.array | None:
    """LayerNorm over the last axis by the compiled kernel; ``None`` where it cannot run.
    ``x`` ``(..., D)``, ``weight`` and ``bias`` ``(D,)`` or ``None``."""
    if not native_applies(x.dtype) or x.ndim == 0:
        return None
    for p in (weight, bias):
        if p is not None and (p.dtype != mx.float32 or p.shape != (x.shape[-1],)):
            return None
    cpu_native.sync_threads()
    return cpu_native.module().layer_norm(x, weight, bias, eps)


# -- the packed-weight GEMM (csrc/gemm.cpp): convs and Linear layers -------------------------------
_packed_gemm = os.environ.get("CANDLE_NN_CPU_GEMM", "auto").strip().lower() != "blas"
# id(weight) -> (weak reference to the weight, its packed form); an entry goes with its weight.
_packed: dict[int, tuple[weakref.ref, mx.array]] = {}


def set_packed_gemm(flag: bool) -> None:
    """Use the packed-weight GEMM where it runs (default; ``CANDLE_NN_CPU_GEMM=blas`` in the
    environment: off), else the im2col + BLAS sgemm conv and MLX's matmul; for A/B checks."""
    global _packed_gemm
    _packed_gemm = bool(flag)


def packed_gemm_applies() -> bool:
    """Whether convs and Linear layers run on the packed GEMM: on, the kernels loaded, and a CPU
    with AVX-512F or AVX2 + FMA (elsewhere OpenBLAS's sgemm stays the GEMM)."""
    kernels = cpu_native.module()
    return _packed_gemm and kernels is not None and kernels.packed_gemm_available()


def packed_weight(weight: mx.array) -> mx.array:
    """``weight`` (``(O, kH, kW, C)`` or ``(out, in)``) packed for the GEMM, once per weight
    array: later calls with the same array object return the cached packing (a weight replaced
    in place by ``weight[...] = v`` is not noticed; assign a new array instead)."""
    key = id(weight)
    hit = _packed.get(key)
    if hit is not None and hit[0]() is weight:
        return hit[1]
    packed = cpu_native.module().pack_gemm_weight(weight.reshape(weight.shape[0], -1))

    def forget(ref: weakref.ref, key: int = key) -> None:
        if _packed.get(key, (None,))[0] is ref:
            del _packed[key]

    _packed[key] = (weakref.ref(weight, forget), packed)
    return packed


def linear(x: mx.array, weight: mx.array, bias: mx.array | None, activation: str | None,
           residual: mx.array | None = None) -> mx.array | None:
    """``activation(x @ weight.T + bias) [+ residual]`` on the packed GEMM with the epilogue
    fused; ``None`` where it does not apply. ``x`` ``(..., in)``, ``weight`` ``(out, in)``,
    ``bias`` ``(out,)``, ``residual`` the output's shape ``(..., out)``."""
    if activation not in _ACT_CODES or not native_applies(x.dtype) or x.ndim == 0 \
            or x.size == 0 or not packed_gemm_applies() or weight.dtype != mx.float32 \
            or (bias is not None and bias.dtype != mx.float32):
        return None
    out, k = weight.shape
    if residual is not None and (residual.dtype != mx.float32
                                 or tuple(residual.shape) != (*x.shape[:-1], out)):
        return None
    res = None if residual is None else residual.reshape(1, 1, -1, out)
    cpu_native.sync_threads()
    y = cpu_native.module().conv2d_packed(x.reshape(1, 1, -1, k), packed_weight(weight), bias,
                                          res, (1, 1), out, (1, 1), (0, 0),
                                          _ACT_CODES[activation], 0 if res is None else 2)
    return y.reshape(*x.shape[:-1], out)


def silu(x: mx.array) -> mx.array:
    """float32 SiLU on the CPU: the compiled kernel, else :data:`silu_f32`."""
    return bias_act(x, None, "silu") if native_applies(x.dtype) else silu_f32(x)


def gelu(x: mx.array) -> mx.array:
    """float32 exact GELU on the CPU: the compiled kernel, else ``cpu_fast_gelu.gelu_f32``."""
    if native_applies(x.dtype):
        return bias_act(x, None, "gelu")
    from .cpu_fast_gelu import gelu_f32

    return gelu_f32(x)


def softmax_last(x: mx.array) -> mx.array | None:
    """float32 softmax over the last axis by the compiled kernel; ``None`` where it cannot."""
    if not native_applies(x.dtype) or x.ndim == 0:
        return None
    cpu_native.sync_threads()
    return cpu_native.module().softmax_last(x)
