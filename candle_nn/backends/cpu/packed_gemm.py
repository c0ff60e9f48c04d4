"""candle_nn's packed-weight GEMM (csrc/gemm.cpp, conv_packed.cpp) for convs, Linear layers and
stride = kernel transposed convs.

MLX limitation: the CPU conv and matmul call OpenBLAS's sgemm, which re-packs the weights on every
call and may run a generic kernel on AVX-512 CPUs. Here the weights are packed once per array
(weight_cache.py) and AVX-512 (12x32) or AVX2 (6x16) micro-kernels gather the im2col blocks
themselves and run the epilogue on each tile in cache (which micro-kernel: cpu_model.py). CPUs
without AVX-512F or AVX2 + FMA keep the BLAS (``available`` is false there).
``CANDLE_NN_CPU_GEMM=blas`` or ``candle_nn.ops.disable("packed_gemm")`` turns it off.
"""

from __future__ import annotations

import mlx.core as mx

from ...ops.registry import register
from . import kernels, weight_cache
from .conv_common import conv_applies, with_epilogue
from .elementwise import ACT, act_code, residual_mode


def available() -> bool:
    """The kernels loaded on a CPU with AVX-512F or AVX2 + FMA."""
    return kernels.loaded() and kernels.module().packed_gemm_available()


def packed_weight(weight: mx.array) -> mx.array:
    """``weight`` (``(O, kH, kW, C)`` or ``(out, in)``) packed for the GEMM, once per weight
    array (weight_cache.py)."""
    return weight_cache.derived(
        "packed_gemm", weight,
        lambda w: kernels.module().pack_gemm_weight(w.reshape(w.shape[0], -1)))


def _run(x, weight, bias, stride, padding, act, residual, mode):
    out, kh, kw, _ = weight.shape
    return kernels.module().conv2d_packed(x, packed_weight(weight), bias, residual, (kh, kw), out,
                                          stride, padding, act, mode)


@register("conv2d", "packed_gemm", "cpu", applies=conv_applies, available=available,
          works_around="OpenBLAS re-packs the weights on every sgemm call")
def conv2d(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
           activation=None, residual=None, residual_after_activation=False):
    return with_epilogue(_run, x, weight, bias, stride, padding, activation, residual,
                         residual_after_activation)


def _linear_applies(x, weight, bias=None, activation=None, residual=None) -> bool:
    if activation not in ACT or not kernels.float32_cpu(x.dtype) or x.ndim == 0 \
            or x.size == 0 or weight.dtype != mx.float32 \
            or (bias is not None and bias.dtype != mx.float32):
        return False
    return residual is None or (residual.dtype == mx.float32
                                and tuple(residual.shape) == (*x.shape[:-1], weight.shape[0]))


@register("linear", "packed_gemm", "cpu", applies=_linear_applies, available=available,
          works_around="OpenBLAS re-packs the weights on every sgemm call")
def linear(x, weight, bias=None, activation=None, residual=None):
    out, k = weight.shape
    res = None if residual is None else residual.reshape(1, 1, -1, out)
    kernels.sync_threads()
    y = kernels.module().conv2d_packed(x.reshape(1, 1, -1, k), packed_weight(weight), bias, res,
                                       (1, 1), out, (1, 1), (0, 0), act_code(activation),
                                       residual_mode(res, True))
    return y.reshape(*x.shape[:-1], out)


def _blocks_weight(weight: mx.array) -> mx.array:
    """A stride == kernel transposed conv's ``(O, kH, kW, I)`` weight as the ``(kH * kW * O, I)``
    Linear weight whose output row ``(i, j, o)`` is the output pixel ``(i, j)`` of a block."""
    out, kh, kw, cin = weight.shape
    return mx.contiguous(weight.transpose(1, 2, 0, 3).reshape(kh * kw * out, cin))


def _blocks_applies(x, weight, bias=None, activation=None) -> bool:
    return (activation in ACT and x.ndim == 4 and kernels.float32_cpu(x.dtype)
            and weight.dtype == mx.float32 and (bias is None or bias.dtype == mx.float32))


@register("conv_transpose2d_blocks", "packed_gemm", "cpu", applies=_blocks_applies,
          available=available,
          works_around="MLX's matmul and the bias/activation pass are two passes over the "
                       "output")
def conv_transpose2d_blocks(x, weight, bias=None, activation=None):
    """The matmul with the bias and activation fused into its tiles."""
    _, kh, kw, _ = weight.shape
    rows = weight_cache.derived("conv_transpose_blocks", weight, _blocks_weight)
    tiled = None if bias is None else mx.tile(bias, kh * kw)
    return linear(x, rows, tiled, activation)
