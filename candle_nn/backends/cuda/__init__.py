"""CUDA implementations of candle_nn's ops (kernels.py): importing this registers them.

They declare ``grad="own"``: each kernel carries the VJP of the same math in MLX ops
(``candle_nn/custom_vjp.py``), so they keep running under ``mx.compile`` and ``mx.grad``.

``CANDLE_NN_CUDA_KERNELS=0`` (or ``candle_nn.ops.disable("cuda")``) turns them off; a comma list
(``dfl,max_pool``) keeps only those.
"""

from __future__ import annotations

from ... import config
from ...ops.activation import bias_act
from ...ops.registry import disable, register
from . import kernels

_LIMITS = {
    "depthwise": "cuDNN's float32 depthwise conv (grouped direct kernel): 34 % of MobileSAM's "
                 "encoder time on an H100",
    "dfl": "softmax over a 16-wide last axis is ~30x off bandwidth",
    "max_pool": "the strided-window reduction materialises kH * kW copies of the input",
    "softmax": "softmax over a short last axis runs one block per row (~35x off bandwidth)",
}


def _depthwise_applies(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                       activation=None, residual=None, residual_after_activation=False) -> bool:
    return tuple(dilation) == (1, 1) and x.ndim == 4 and kernels.on_cuda("depthwise", x.dtype)


@register("depthwise_conv2d", "depthwise", "cuda", applies=_depthwise_applies,
          available=kernels._cuda_backend, grad="own",
          works_around=_LIMITS["depthwise"])
def depthwise_conv2d(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                     activation=None, residual=None, residual_after_activation=False):
    y = kernels.depthwise_conv2d(x, weight, bias, tuple(stride), tuple(padding))
    return bias_act(y, None, activation, residual, residual_after_activation)


@register("dfl_decode", "dfl", "cuda", applies=lambda x, weight: kernels.on_cuda("dfl", x.dtype),
          available=kernels._cuda_backend, grad="own",
          works_around=_LIMITS["dfl"])
def dfl_decode(x, weight):
    return kernels.dfl_decode(x, weight.reshape(x.shape[-1]))


@register("max_pool2d", "max_pool", "cuda",
          applies=lambda x, kernel, stride, padding: kernels.on_cuda("max_pool", x.dtype),
          available=kernels._cuda_backend, grad="own", works_around=_LIMITS["max_pool"])
def max_pool2d(x, kernel, stride, padding):
    return kernels.max_pool2d(x, kernel, stride, padding)


def _softmax_applies(x, axis=-1) -> bool:
    return (axis in (-1, x.ndim - 1) and x.ndim > 0 and 0 < x.shape[-1] <= kernels.SHORT_ROW
            and 0 < x.size < kernels.MAX_ELEMENTS and kernels.on_cuda("softmax", x.dtype))


@register("softmax", "softmax", "cuda", applies=_softmax_applies,
          available=kernels._cuda_backend, grad="own", works_around=_LIMITS["softmax"])
def softmax(x, axis=-1):
    return kernels.softmax_short(x)


_mode, _names = config.cuda_kernels()
if _mode == "off":
    disable("cuda")
elif _mode == "named":
    disable(*(f"cuda:{name}" for name in set(_LIMITS) - _names))
