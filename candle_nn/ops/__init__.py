"""candle_nn's ops: each a function whose body is the plain-MLX reference, with the faster
backend implementations registered against it (``candle_nn/backends/cpu/``,
``candle_nn/backends/cuda/``, which ``import candle_nn`` loads; the registry and its rules:
registry.py).

Switching implementations (by implementation, backend or op name; :func:`status` lists them)::

    import candle_nn as cn
    with cn.ops.disabled("winograd"):      # 3x3 convs by the packed GEMM / im2col instead
        y = model(x)
    cn.ops.disable("cpu")                 # every CPU fast path off: plain MLX ops
"""

from __future__ import annotations

from .activation import (
    ACTIVATIONS, bias_act, check_activation, gelu, gelu_tanh, relu, sigmoid, silu, softmax,
)
from .concat import concat_last
from .attention import (multi_head_attention, packed_qkv_attention,
                        scaled_dot_product_attention, window_attention, window_merge,
                        window_partition)
from .conv import (blocks_to_image, conv2d, conv_transpose2d_blocks, depthwise_conv2d,
                   is_depthwise)
from .dfl import dfl_decode
from .linear import linear
from .mask_postprocess import resize_masks, stability_score
from .mask_upscale import mask_upscale
from .norm import batch_norm_train, layer_norm
from .point_attention import point_norm, point_pool, point_probs
from .pooling import max_pool2d
from .reduce import channel_mean, channel_sum
from .registry import (
    Impl, Op, disable, disabled, enable, implementations, is_enabled, only, ops, refresh,
    status,
)

__all__ = [
    "ACTIVATIONS", "Impl", "Op", "batch_norm_train", "bias_act", "blocks_to_image",
    "channel_mean", "channel_sum",
    "check_activation", "concat_last", "conv2d",
    "conv_transpose2d_blocks", "depthwise_conv2d",
    "dfl_decode", "disable", "disabled", "enable", "gelu", "gelu_tanh", "implementations",
    "is_depthwise", "is_enabled", "layer_norm", "linear", "mask_upscale", "max_pool2d",
    "multi_head_attention",
    "only", "ops", "packed_qkv_attention", "point_norm", "point_pool", "point_probs", "refresh",
    "relu",
    "resize_masks", "scaled_dot_product_attention", "stability_score",
    "sigmoid",
    "silu", "softmax", "status", "window_attention", "window_merge", "window_partition",
]
