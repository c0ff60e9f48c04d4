"""A Linear layer the packed GEMM does not take: MLX's matmul, then the bias, activation and
residual by the compiled epilogue kernel (elementwise.py) instead of ``addmm`` and separate
passes (MLX's element-wise ops run on one thread)."""

from __future__ import annotations

from ...ops.activation import bias_act
from ...ops.registry import register
from . import kernels


def _applies(x, weight, bias=None, activation=None, residual=None) -> bool:
    return bias is not None and kernels.float32_cpu(x.dtype)


@register("linear", "matmul_epilogue", "cpu", applies=_applies, available=kernels.loaded,
          grad="mlx", works_around="element-wise ops (addmm's bias, the activation) on one thread")
def linear(x, weight, bias=None, activation=None, residual=None):
    return bias_act(x @ weight.T, bias, activation, residual, residual_after_activation=True)
