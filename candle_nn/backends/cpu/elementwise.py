"""The compiled element-wise kernels (csrc/kernels.cpp) for the epilogue, SiLU, GELU, sigmoid,
softmax.

MLX limitation: every CPU element-wise op (and ``mx.compile``'s fused kernels) runs on ONE
thread, with scalar ``exp``/``erf`` calls, and a layer's bias, residual add and activation are
separate passes over memory: here one multithreaded pass.
"""

from __future__ import annotations

import mlx.core as mx

from ...ops.registry import register
from . import kernels

ACT: dict[str | None, str] = {None: "identity", "identity": "identity", "relu": "relu",
                              "silu": "silu", "swish": "silu", "gelu": "gelu",
                              "gelu_erf": "gelu", "sigmoid": "sigmoid"}
if kernels.loaded() and not hasattr(kernels.module().Act, "sigmoid"):
    del ACT["sigmoid"]  # kernels built from older sources: sigmoid stays on MLX's op


def act_code(activation: str | None):
    """The kernels' ``Act`` for an activation name (``KeyError`` for one they lack)."""
    return getattr(kernels.module().Act, ACT[activation])


def residual_mode(residual: mx.array | None, after: bool):
    """The kernels' ``Residual`` for an epilogue."""
    names = kernels.module().Residual
    return names.none if residual is None else (names.after_act if after else names.before_act)


def _bias_act_applies(y, bias=None, activation=None, residual=None,
                      residual_after_activation=False) -> bool:
    if activation not in ACT or not kernels.float32_cpu(y.dtype) or y.ndim == 0:
        return False
    if bias is not None and (bias.dtype != mx.float32 or bias.shape != (y.shape[-1],)):
        return False
    return residual is None or (residual.dtype == mx.float32 and residual.shape == y.shape)


@register("bias_act", "bias_act", "cpu", applies=_bias_act_applies, available=kernels.loaded,
          works_around="element-wise ops run on one thread, one pass per op")
def bias_act(y, bias=None, activation=None, residual=None, residual_after_activation=False):
    if bias is None and residual is None and ACT[activation] == "identity":
        return y
    kernels.sync_threads()
    return kernels.module().bias_act(y, bias, residual, act_code(activation),
                                     residual_mode(residual, residual_after_activation))


def _unary_applies(x) -> bool:
    return kernels.float32_cpu(x.dtype) and x.ndim > 0


@register("silu", "silu", "cpu", applies=_unary_applies, available=kernels.loaded,
          works_around="sigmoid is a scalar libm exp on one thread")
def silu(x):
    return bias_act(x, None, "silu")


@register("gelu", "gelu", "cpu", applies=_unary_applies, available=kernels.loaded,
          works_around="erf is a scalar call on one thread (GELU was half of TinyViT's time)")
def gelu(x):
    return bias_act(x, None, "gelu")


@register("sigmoid", "sigmoid", "cpu", applies=lambda x: "sigmoid" in ACT and _unary_applies(x),
          available=kernels.loaded,
          works_around="sigmoid is a scalar libm exp on one thread (YOLOv8's class scores: "
                       "~20 ns an element)")
def sigmoid(x):
    return bias_act(x, None, "sigmoid")


def _softmax_applies(x, axis=-1) -> bool:
    return axis in (-1, x.ndim - 1) and _unary_applies(x)


@register("softmax", "softmax", "cpu", applies=_softmax_applies, available=kernels.loaded,
          works_around="softmax runs on one thread with a scalar exp")
def softmax(x, axis=-1):
    kernels.sync_threads()
    return kernels.module().softmax_last(x)
