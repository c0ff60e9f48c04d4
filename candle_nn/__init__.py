"""candle_nn: candle-nn's building blocks on MLX arrays.

Images are NHWC; conv weights are read in candle/PyTorch layout and kept in MLX's
``(O, kH, kW, I)``. See README.md for a tour. Importing it applies candle_nn's import-time
policy (``_startup.py``, the one place that states the import-order rule) and registers the ops'
backend implementations (``ops/``, ``backends/``).
"""

from __future__ import annotations

# First: the import-time policy, in place before any module below imports MLX (_startup.py).
from . import _startup  # noqa: F401  (imported for that effect)
from .sysinfo import info

from .activation import (
    ACTIVATIONS, Activation, gelu, gelu_tanh, relu, sigmoid, silu, softmax,
)
from . import backends, config, ops  # noqa: F401  (backends: registers the ops' implementations)
from .ops.attention import (
    multi_head_attention, packed_qkv_attention, scaled_dot_product_attention, window_attention,
)
from .batch_norm import BatchNorm2d, freeze_bn_stats
from .checkpoint import save_safetensors, state_dict
from .conv import Conv2d, Conv2dConfig, ConvTranspose2d, ConvTranspose2dConfig
from .conv1d import Conv1d, Conv1dConfig, ConvTranspose1d, ConvTranspose1dConfig
from .conv_bn import ConvBn
from .device import Device
from .dropout import Dropout
from .embedding import Embedding
from .errors import (
    CandleNNError, ConfigError, DeviceMismatchError, DeviceUnavailableError, DTypeError, ImageError,
    MissingTensorError, ModuleInitError, OutOfRangeError, ShapeMismatchError, WeightsFileError,
)
from .group_norm import GroupNorm
from .init import Init
from .inputs import check_image_batch, model_dtype
from .layer_norm import LayerNorm, LayerNorm2d, LayerNormConfig
from .linear import Linear
from .module import Module, Sequential, check_same_device, seq
from .pooling import AvgPool2d, MaxPool2d, avg_pool2d, max_pool2d
from .precision import float32_precision, set_float32_precision
from .upsample import upsample_bilinear2d, upsample_nearest2d
from .var_builder import (
    TensorSource, VarBuilder, check_weights_path, open_safetensors, read_tensor,
)
from .var_map import VarMap

from .version import __version__  # noqa: F401  (re-exported)

__all__ = [
    "ACTIVATIONS", "Activation", "AvgPool2d", "BatchNorm2d", "CandleNNError", "ConfigError",
    "Conv1d",
    "Conv1dConfig", "Conv2d", "Conv2dConfig", "ConvBn", "ConvTranspose1d", "ConvTranspose1dConfig",
    "ConvTranspose2d", "ConvTranspose2dConfig", "DTypeError", "Device", "DeviceMismatchError",
    "DeviceUnavailableError", "Dropout", "Embedding", "GroupNorm", "ImageError", "Init",
    "LayerNorm", "LayerNorm2d", "LayerNormConfig", "Linear", "MaxPool2d", "MissingTensorError",
    "Module", "ModuleInitError", "OutOfRangeError", "Sequential", "ShapeMismatchError",
    "TensorSource", "VarBuilder", "VarMap",
    "WeightsFileError",
    "avg_pool2d", "check_image_batch", "check_same_device", "check_weights_path",
    "freeze_bn_stats",
    "float32_precision", "gelu", "gelu_tanh", "info", "max_pool2d", "model_dtype",
    "multi_head_attention",
    "open_safetensors", "packed_qkv_attention", "read_tensor", "relu", "save_safetensors",
    "scaled_dot_product_attention", "seq", "set_float32_precision", "sigmoid", "silu",
    "softmax", "state_dict", "upsample_bilinear2d", "upsample_nearest2d", "window_attention",
]
