"""Hand-written CUDA kernels for the hot non-convolution parts, through ``mx.fast.cuda_kernel``;
registered as the ``cuda`` implementations of their ops (``__init__.py``).

Each kernel is used only when the op runs on a CUDA GPU (:func:`on_cuda`); the CPU and Metal keep
MLX's own ops, unchanged. Every kernel accumulates in float32 whatever the storage dtype, and is
checked against the op's reference in tests/candle_nn/backends/test_cuda_kernels.py (on a CUDA
machine; elsewhere those tests check that the reference is taken).

Kernels:

* :func:`depthwise_conv2d`: NHWC depthwise convolution (one filter per channel) with the bias
  fused. In float32 cuDNN runs these through ``conv2d_grouped_direct_kernel``: 34 % of the
  MobileSAM encoder's GPU time on an H100 (2.3 of 6.9 ms at batch 1).
* :func:`dfl_decode`: YOLOv8's distribution-focal-loss decoding (softmax over 16 bins and the
  projection) in one pass; MLX's softmax over a 16-wide last axis is ~30x off bandwidth.
* :func:`max_pool2d`: NHWC max pooling with implicit -inf padding, one pass over the input
  (MLX's strided-window reduction materialises ``kH * kW`` copies of the input first).
* :func:`softmax_short`: softmax over a last axis of at most :data:`SHORT_ROW` elements, one row
  per thread (MLX runs one block per row: 1.45 ms for SAM's automatic-mask attention
  probabilities, ``(64, 4096, 8, 7)``, on an H100).

Custom kernels have no VJP in MLX: each kernel's gradient is that of the same math in MLX ops
(``candle_nn/custom_vjp.py``), so models using them train, compiled or not.

``CANDLE_NN_CUDA_KERNELS=0`` (or ``candle_nn.ops.disable("cuda")``) switches them all off (MLX's
own ops everywhere); ``CANDLE_NN_CUDA_KERNELS=dfl,max_pool`` keeps only those named, for every
dtype.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from ... import config
from ...custom_vjp import with_reference_vjp
from ...ops.pooling import max_pool2d as max_pool2d_op

_THREADS = 256


@functools.lru_cache(maxsize=1)
def _cuda_backend() -> bool:
    return bool(getattr(mx, "cuda", None) and mx.cuda.is_available())


# The dtypes each kernel is used for by default: those where it was measured faster than MLX's op
# on an H100 (benchmarks/bench_gpu_kernels.py). In float16 the depthwise kernel only matches
# cuDNN's (faster at 256x256x256, slower at 64x64x160; the MobileSAM encoder no faster at batch 1
# or 8), so float16 keeps cuDNN.
DEFAULT_DTYPES: dict[str, tuple[mx.Dtype, ...]] = {
    "depthwise": (mx.float32,),
    "dfl": (mx.float32, mx.float16, mx.bfloat16),
    "max_pool": (mx.float32, mx.float16, mx.bfloat16),
    "softmax": (mx.float32, mx.float16, mx.bfloat16),
}

_DEPTHWISE_COLUMNS = (4, 2)  # output pixels of one row per thread of depthwise_conv2d
_FULL_GRID = 2**16  # threads that keep an H100 busy (132 SMs x 2048 threads = 270k)
SHORT_ROW = 32  # the longest last axis :func:`softmax_short` takes
MAX_ELEMENTS = 2**31  # its row count is an int32 and its offsets 32-bit: larger arrays take MLX's


def on_cuda(kernel: str, dtype: mx.Dtype | None = None) -> bool:
    """Whether ``kernel`` (``depthwise``, ``dfl``, ``max_pool``, ``softmax``) suits ``dtype``
    here: the current default device is a CUDA GPU and ``dtype`` is one of
    :data:`DEFAULT_DTYPES`, or ``CANDLE_NN_CUDA_KERNELS`` names the kernel (then for every
    dtype). The on/off switches are the registry's."""
    if mx.default_device().type != mx.DeviceType.gpu or not _cuda_backend():
        return False
    mode, names = config.cuda_kernels()
    if mode == "named" and kernel in names:
        return True
    return dtype is None or dtype in DEFAULT_DTYPES.get(kernel, ())


def _window_loop(body: str) -> str:
    """CUDA source visiting the ``KH x KW`` input pixels of output pixel ``(n, oh, ow)``, stride
    ``SH, SW``, padding ``PH, PW`` (pixels outside the input are skipped): ``body`` runs with
    ``i, j`` (tap) and ``at`` (index of channel ``c`` of that pixel in the NHWC input)."""
    return r"""
    #pragma unroll
    for (int i = 0; i < KH; ++i) {
        const int ih = oh * SH - PH + i;
        if (ih < 0 || ih >= H) continue;
        #pragma unroll
        for (int j = 0; j < KW; ++j) {
            const int iw = ow * SW - PW + j;
            if (iw < 0 || iw >= W) continue;
            const long at = (((long)n * H + ih) * W + iw) * C + c;
""" + body + r"""
        }
    }
"""


def _output_pixel(per_thread: str) -> str:
    """CUDA source mapping this thread to output element ``idx`` of an NHWC ``(N, OH, OW, C)``
    output where each thread handles ``per_thread`` consecutive channels: defines ``idx`` (in
    units of ``per_thread``), ``c`` (first channel), ``ow``, ``oh``, ``n``."""
    return rf"""
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    constexpr int CV = C / ({per_thread});
    if (idx >= (long)N * OH * OW * CV) return;
    const int c = (idx % CV) * ({per_thread});
    long t = idx / CV;
    const int ow = t % OW; t /= OW;
    const int oh = t % OH;
    const int n = t / OH;
"""


# One thread: VEC consecutive channels (16-byte loads) of R consecutive output pixels of one
# output row; each input row segment is loaded once for the R outputs that overlap on it.
_DEPTHWISE = r"""
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    constexpr int CV = C / VEC;
    constexpr int OWR = (OW + R - 1) / R;
    constexpr int IW = (R - 1) * SW + KW;
    if (idx >= (long)N * OH * OWR * CV) return;
    const int c = (idx % CV) * VEC;
    long t = idx / CV;
    const int ow0 = (t % OWR) * R; t /= OWR;
    const int oh = t % OH;
    const int n = t / OH;
    float acc[R][VEC];
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        #pragma unroll
        for (int v = 0; v < VEC; ++v) acc[r][v] = static_cast<float>(b[c + v]);
    }
    #pragma unroll
    for (int i = 0; i < KH; ++i) {
        const int ih = oh * SH - PH + i;
        if (ih < 0 || ih >= H) continue;
        const long row = ((long)n * H + ih) * W;
        float xin[IW][VEC];
        bool inside[IW];  // taps outside the image add nothing (implicit padding, as MLX's conv)
        #pragma unroll
        for (int q = 0; q < IW; ++q) {
            const int iw = ow0 * SW - PW + q;
            inside[q] = iw >= 0 && iw < W;
            if (inside[q]) {
                const Pack<T, VEC> xv =
                    *reinterpret_cast<const Pack<T, VEC>*>(x + (row + iw) * C + c);
                #pragma unroll
                for (int v = 0; v < VEC; ++v) xin[q][v] = static_cast<float>(xv.v[v]);
            } else {
                #pragma unroll
                for (int v = 0; v < VEC; ++v) xin[q][v] = 0.f;
            }
        }
        #pragma unroll
        for (int j = 0; j < KW; ++j) {
            float wv[VEC];
            #pragma unroll
            for (int v = 0; v < VEC; ++v)
                wv[v] = static_cast<float>(w[(c + v) * KH * KW + i * KW + j]);
            #pragma unroll
            for (int r = 0; r < R; ++r) {
                #pragma unroll
                for (int v = 0; v < VEC; ++v)
                    if (inside[r * SW + j]) acc[r][v] += xin[r * SW + j][v] * wv[v];
            }
        }
    }
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        if (ow0 + r >= OW) break;
        Pack<T, VEC> o;
        #pragma unroll
        for (int v = 0; v < VEC; ++v) o.v[v] = static_cast<T>(acc[r][v]);
        *reinterpret_cast<Pack<T, VEC>*>(out + (((long)n * OH + oh) * OW + ow0 + r) * C + c) = o;
    }
"""

_PACK = r"""
template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T v[N]; };
"""


@functools.lru_cache(maxsize=None)
def _depthwise_kernel():
    return mx.fast.cuda_kernel(name="candle_nn_depthwise_conv2d", input_names=["x", "w", "b"],
                               output_names=["out"], source=_DEPTHWISE, header=_PACK)


def depthwise_conv2d(x: mx.array, weight: mx.array, bias: mx.array | None,
                     stride: tuple[int, int], padding: tuple[int, int]) -> mx.array:
    """Depthwise conv: ``x`` ``(N, H, W, C)``, ``weight`` ``(C, kH, kW, 1)``, ``bias`` ``(C,)``
    or ``None`` → ``(N, H', W', C)``, zero padding, no dilation."""
    n, h, w, c = x.shape
    _, kh, kw, _ = weight.shape
    (sh, sw), (ph, pw) = stride, padding
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    if bias is None:
        bias = mx.zeros((c,), dtype=x.dtype)
    vec = max(v for v in (1, 2, 4, 8) if c % v == 0 and v * x.dtype.size <= 16)
    # Several output pixels per thread share their input loads, but only while enough threads
    # remain to fill the GPU.
    columns = next((r for r in _DEPTHWISE_COLUMNS if n * oh * ow * c // (vec * r) >= _FULL_GRID), 1)
    total = n * oh * -(-ow // columns) * c // vec
    params = dict(N=n, H=h, W=w, C=c, OH=oh, OW=ow, KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw,
                  VEC=vec, R=columns)

    def run(x: mx.array, weight: mx.array, bias: mx.array) -> mx.array:
        return _depthwise_kernel()(
            inputs=[x, weight.astype(x.dtype), bias.astype(x.dtype)],
            template=[("T", x.dtype), *params.items()],
            grid=(_round_up(total), 1, 1), threadgroup=(_THREADS, 1, 1),
            output_shapes=[(n, oh, ow, c)], output_dtypes=[x.dtype])[0]

    def reference(x: mx.array, weight: mx.array, bias: mx.array) -> mx.array:
        y = mx.conv2d(x, weight.astype(x.dtype), stride=stride, padding=padding, groups=c)
        return y + bias.astype(x.dtype)

    return with_reference_vjp(run, reference)(x, weight, bias)


_DFL = r"""
    // One thread: one box side of one anchor: softmax over BINS logits, dotted with the weights.
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= ROWS) return;
    const T* row = x + idx * BINS;
    float v[BINS];
    float m = -INFINITY;
    #pragma unroll
    for (int i = 0; i < BINS; ++i) { v[i] = static_cast<float>(row[i]); m = fmaxf(m, v[i]); }
    float sum = 0.f, dot = 0.f;
    #pragma unroll
    for (int i = 0; i < BINS; ++i) {
        const float e = expf(v[i] - m);
        sum += e;
        dot += e * static_cast<float>(w[i]);
    }
    out[idx] = static_cast<T>(dot / sum);
"""


@functools.lru_cache(maxsize=None)
def _dfl_kernel():
    return mx.fast.cuda_kernel(name="candle_nn_dfl_decode", input_names=["x", "w"],
                               output_names=["out"], source=_DFL)


def dfl_decode(x: mx.array, weight: mx.array) -> mx.array:
    """YOLOv8's DFL: ``x`` ``(..., bins)`` logits, ``weight`` ``(bins,)`` → ``(...)``, the
    softmax over the bins dotted with ``weight`` (float32 inside)."""
    bins = x.shape[-1]
    rows = x.size // bins

    def run(x: mx.array, weight: mx.array) -> mx.array:
        return _dfl_kernel()(
            inputs=[x, weight.astype(mx.float32)], template=[("T", x.dtype), ("BINS", bins),
                                                             ("ROWS", rows)],
            grid=(_round_up(rows), 1, 1), threadgroup=(_THREADS, 1, 1),
            output_shapes=[x.shape[:-1]], output_dtypes=[x.dtype])[0]

    def reference(x: mx.array, weight: mx.array) -> mx.array:
        probs = mx.softmax(x.astype(mx.float32), axis=-1)
        return (probs @ weight.astype(mx.float32)).astype(x.dtype)

    return with_reference_vjp(run, reference)(x, weight)


_MAX_POOL = _output_pixel("1") + r"""
    float best = -INFINITY;
""" + _window_loop(r"""
            const float v = static_cast<float>(x[at]);
            best = (v > best || v != v) ? v : best;  // fmaxf would drop a NaN
""") + r"""
    out[idx] = static_cast<T>(best);
"""


@functools.lru_cache(maxsize=None)
def _max_pool_kernel():
    return mx.fast.cuda_kernel(name="candle_nn_max_pool2d", input_names=["x"],
                               output_names=["out"], source=_MAX_POOL)


def max_pool2d(x: mx.array, kernel: tuple[int, int], stride: tuple[int, int],
               padding: tuple[int, int]) -> mx.array:
    """Max pooling ``(N, H, W, C)`` → ``(N, H', W', C)``, padding with -inf (PyTorch's rule)."""
    n, h, w, c = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    total = n * oh * ow * c
    params = dict(N=n, H=h, W=w, C=c, OH=oh, OW=ow, KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw)

    def run(x: mx.array) -> mx.array:
        return _max_pool_kernel()(
            inputs=[x], template=[("T", x.dtype), *params.items()],
            grid=(_round_up(total), 1, 1), threadgroup=(_THREADS, 1, 1),
            output_shapes=[(n, oh, ow, c)], output_dtypes=[x.dtype])[0]

    def reference(x: mx.array) -> mx.array:  # the op's: PyTorch's gradient for tied maxima
        return max_pool2d_op.reference(x, kernel, stride, padding)

    return with_reference_vjp(run, reference)(x)


_SOFTMAX_SHORT = r"""
    const unsigned int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= static_cast<unsigned int>(rows[0])) return;
    const T* in = x + row * LEN;
    float v[LEN];
    float top = -INFINITY;
    for (int j = 0; j < LEN; ++j) {
        v[j] = static_cast<float>(in[j]);
        top = (v[j] > top || v[j] != v[j]) ? v[j] : top;  // fmaxf would drop a NaN
    }
    float sum = 0.0f;
    for (int j = 0; j < LEN; ++j) {
        v[j] = expf(v[j] - top);
        sum += v[j];
    }
    T* o = out + row * LEN;
    for (int j = 0; j < LEN; ++j) o[j] = static_cast<T>(v[j] / sum);
"""


@functools.lru_cache(maxsize=None)
def _softmax_short_kernel():
    return mx.fast.cuda_kernel(name="candle_nn_softmax_short", input_names=["x", "rows"],
                               output_names=["out"], source=_SOFTMAX_SHORT)


def softmax_short(x: mx.array) -> mx.array:
    """Softmax over the last axis (at most :data:`SHORT_ROW` long), any leading shape, float32
    inside. The row count is an input, not a template value: one compiled kernel per dtype and
    length, whatever the batch."""
    length = x.shape[-1]
    rows = x.size // length

    def run(x: mx.array) -> mx.array:
        return _softmax_short_kernel()(
            inputs=[x, mx.array([rows], dtype=mx.int32)], template=[("T", x.dtype),
                                                                     ("LEN", length)],
            grid=(_round_up(rows), 1, 1), threadgroup=(_THREADS, 1, 1),
            output_shapes=[x.shape], output_dtypes=[x.dtype])[0]

    def reference(x: mx.array) -> mx.array:
        return mx.softmax(x, axis=-1, precise=True)

    return with_reference_vjp(run, reference)(x)


def _round_up(total: int) -> int:
    return -(-total // _THREADS) * _THREADS
