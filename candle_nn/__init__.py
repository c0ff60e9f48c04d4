"""candle_nn: candle-nn's building blocks on MLX arrays.

Images are NHWC; conv weights are read in candle/PyTorch layout and kept in MLX's
``(O, kH, kW, I)``. See README.md for a tour.
"""

from __future__ import annotations

# Before MLX initialises: float32 means float32 on CUDA too (see precision.py).
from . import precision as _precision

_precision.configure_from_env()
# ... and kernels launched the way that is fastest for inference on CUDA (see cuda_launch.py).
from . import cuda_launch as _cuda_launch  # noqa: E402

_cuda_launch.configure_from_env()

# Before anything imports MLX: an optimized CPU BLAS instead of MLX's bundled reference one on
# Linux (see blas.py; CANDLE_NN_BLAS=off opts out). candle_nn.info() reports what is in use.
from . import blas as _blas  # noqa: E402

_blas.preload()

from .sysinfo import info  # noqa: E402

from .activation import (  # noqa: E402
    ACTIVATIONS, Activation, gelu, gelu_tanh, relu, sigmoid, silu, softmax,
)
from .attention import scaled_dot_product_attention  # noqa: E402
from .batch_norm import BatchNorm2d  # noqa: E402
from .checkpoint import save_safetensors, state_dict  # noqa: E402
from .conv import Conv2d, Conv2dConfig, ConvTranspose2d, ConvTranspose2dConfig  # noqa: E402
from .device import Device  # noqa: E402
from .embedding import Embedding  # noqa: E402
from .errors import (  # noqa: E402
    CandleNNError, DeviceMismatchError, DeviceUnavailableError, DTypeError, ImageError,
    MissingTensorError, ShapeMismatchError, WeightsFileError,
)
from .init import Init  # noqa: E402
from .inputs import check_image_batch, model_dtype  # noqa: E402
from .layer_norm import LayerNorm, LayerNorm2d, LayerNormConfig  # noqa: E402
from .linear import Linear  # noqa: E402
from .module import Module, Sequential, check_same_device, seq  # noqa: E402
from .pooling import AvgPool2d, MaxPool2d, avg_pool2d, max_pool2d  # noqa: E402
from .precision import float32_precision, set_float32_precision  # noqa: E402
from .upsample import upsample_bilinear2d, upsample_nearest2d  # noqa: E402
from .var_builder import (  # noqa: E402
    TensorSource, VarBuilder, check_weights_path, open_safetensors, read_tensor,
)
from .var_map import VarMap  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ACTIVATIONS", "Activation", "AvgPool2d", "BatchNorm2d", "CandleNNError", "Conv2d",
    "Conv2dConfig", "ConvTranspose2d", "ConvTranspose2dConfig", "DTypeError", "Device",
    "DeviceMismatchError", "DeviceUnavailableError", "Embedding", "ImageError", "Init",
    "LayerNorm", "LayerNorm2d", "LayerNormConfig", "Linear", "MaxPool2d", "MissingTensorError",
    "Module", "Sequential", "ShapeMismatchError", "TensorSource", "VarBuilder", "VarMap",
    "WeightsFileError",
    "avg_pool2d", "check_image_batch", "check_same_device", "check_weights_path",
    "float32_precision", "gelu", "gelu_tanh", "info", "max_pool2d", "model_dtype",
    "open_safetensors", "read_tensor", "relu", "save_safetensors",
    "scaled_dot_product_attention", "seq", "set_float32_precision", "sigmoid", "silu",
    "softmax", "state_dict", "upsample_bilinear2d", "upsample_nearest2d",
]
