"""A groups-1 conv as a multithreaded im2col + the optimized BLAS's sgemm + one epilogue pass
(csrc/kernels.cpp ``conv2d_fused``), where the packed GEMM does not run.

MLX limitation: the CPU conv builds its im2col with single-threaded general-stride copies (a zero
fill, the padded input, then the patches) before the sgemm, then runs the epilogue as separate
passes. The sgemm is the one MLX's own calls resolve to (blas.py binds it); without an optimized
BLAS there is none (``available`` is false).
"""

from __future__ import annotations

from ...ops.registry import register
from . import kernels
from .conv_common import conv_applies, with_epilogue


def _run(x, weight, bias, stride, padding, act, residual, mode):
    return kernels.module().conv2d_fused(x, weight, bias, residual, stride, padding, act, mode)


@register("conv2d", "im2col", "cpu", applies=conv_applies, available=kernels.has_sgemm,
          works_around="the CPU conv's im2col is single-threaded general-stride copies")
def conv2d(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
           activation=None, residual=None, residual_after_activation=False):
    return with_epilogue(_run, x, weight, bias, stride, padding, activation, residual,
                         residual_after_activation)
