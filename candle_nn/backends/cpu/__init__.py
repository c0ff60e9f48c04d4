"""CPU implementations of candle_nn's ops: importing this registers them, in dispatch order.

Each module names the MLX limitation it works around. ``kernels.py`` loads the compiled C++
module (``candle_nn/csrc/``); ``weight_cache.py`` keeps what the kernels derive from a weight.
All of them run only on the CPU device (mostly float32): GPU results never change.
``CANDLE_NN_CPU_FAST=0`` (or ``candle_nn.ops.disable("cpu")``) turns every one off.
"""

from __future__ import annotations

from ... import config
from ...ops.registry import disable
from . import (  # noqa: F401  (imported to register; the order is the dispatch order)
    elementwise, silu_poly, gelu_poly, winograd, linear_rows, packed_gemm, im2col, depthwise,
    attention, point_attention, mask_upscale, mask_postprocess, layer_norm, linear_epilogue,
    max_pool, concat, conv_grad, batch_norm_vjp,
)

if not config.flag("CANDLE_NN_CPU_FAST"):
    disable("cpu")
if config.get("CANDLE_NN_CPU_GEMM").lower() == "blas":
    disable("packed_gemm")
