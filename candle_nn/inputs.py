"""Input checks at a model's boundary: one clear error instead of a raw MLX one (or silent float32).

Image models take NHWC ``mx.array`` batches ``(N, H, W, C)`` in the model's floating dtype.
:func:`check_image_batch` refuses, with a :class:`~candle_nn.errors.CandleNNError` that names the
fix, what people commonly pass instead: NumPy arrays (wrap with ``mx.array``), NCHW batches
(``x.transpose(0, 2, 3, 1)``), a single image (``x[None]``), uint8 pixels (the model's
preprocessing), or another float dtype than the model's (``x.astype(...)``: a float16 model fed
float32 would otherwise quietly compute in float32). Nothing is converted implicitly.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from .errors import CandleNNError, DTypeError, ShapeMismatchError


def model_dtype(module: Any) -> mx.Dtype | None:
    """The dtype of ``module``'s first floating parameter (depth first), ``None`` without one."""
    for value in module.values():
        found = _first_float_dtype(value)
        if found is not None:
            return found
    return None


def _first_float_dtype(value: Any) -> mx.Dtype | None:
    if isinstance(value, mx.array):
        return value.dtype if mx.issubdtype(value.dtype, mx.floating) else None
    if isinstance(value, dict):
        values = list(value.values())
    elif isinstance(value, (list, tuple)):
        values = list(value)
    else:
        return None
    for v in values:
        found = _first_float_dtype(v)
        if found is not None:
            return found
    return None


def check_image_batch(x: Any, *, model: str, dtype: mx.Dtype | None, channels: int = 3,
                      preprocessing: str) -> None:
    """Raise unless ``x`` is an ``(N, H, W, channels)`` ``mx.array`` of floating ``dtype``.

    Args:
        x: what the caller passed to the model.
        model: the model's name, for the message (``"ResNet"``).
        dtype: the model's dtype (``None``: any floating dtype).
        channels: the expected number of channels (last axis).
        preprocessing: how to make a proper input from an image, for the message
            (``"candle_nn_models.imagenet.preprocess(rgb)"``).
    """
    want = f"an NHWC mx.array (N, H, W, {channels})"
    if not isinstance(x, mx.array):
        kind = type(x).__module__.split(".")[0] + "." + type(x).__name__
        raise DTypeError(f"{model} expects {want}, got a {kind}; wrap it with mx.array(x)"
                         + (" (after np.stack for a list of images)" if kind == "builtins.list"
                            else ""))
    shape = tuple(x.shape)
    if x.ndim == 3 and shape[-1] == channels:
        raise ShapeMismatchError(f"{model} expects {want}, got one image {shape}: add the batch "
                                 "axis with x[None]")
    if x.ndim == 4 and shape[1] == channels and shape[-1] != channels:
        raise ShapeMismatchError(f"{model} expects {want}, got {shape}, which looks like NCHW: "
                                 "transpose it with x.transpose(0, 2, 3, 1)")
    if x.ndim != 4 or shape[-1] != channels:
        raise ShapeMismatchError(f"{model} expects {want}, got shape {shape}")
    if shape[0] == 0:
        raise ShapeMismatchError(f"{model} got an empty batch {shape}: pass at least one image")
    if 0 in shape[1:3]:
        raise ShapeMismatchError(f"{model} got images of {shape[2]}x{shape[1]} pixels {shape}: "
                                 f"an image needs at least one pixel; prepare it with "
                                 f"{preprocessing}")
    if not mx.issubdtype(x.dtype, mx.floating):
        raise DTypeError(f"{model} expects preprocessed floats, got {_name(x.dtype)} pixels: "
                         f"prepare images with {preprocessing}")
    if dtype is not None and x.dtype != dtype:
        name = _name(dtype)
        raise DTypeError(f"{model} was built in {name} but the input is "
                         f"{_name(x.dtype)}: cast it with x.astype(mx.{name}) (or "
                         "build the model in the input's dtype with VarBuilder(..., dtype=))")


def check_rgb_image(image: Any, *, where: str,
                    error: type[CandleNNError] = ShapeMismatchError) -> np.ndarray:
    """``image`` as a NumPy ``(H, W, 3)`` uint8 array with at least one pixel (what image
    preprocessing takes: ``np.asarray(PIL.Image.open(path).convert("RGB"))``); else ``error``
    (by default a ShapeMismatchError, which is a ValueError) naming ``where`` and the fix."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise error(f"{where} expects an (H, W, 3) uint8 RGB image, got {image.dtype} "
                    f"{image.shape}: load it with np.asarray(PIL.Image.open(path).convert('RGB'))")
    if 0 in image.shape[:2]:
        raise error(f"{where} got an empty image ({image.shape[1]}x{image.shape[0]} pixels): "
                    "an image needs at least one pixel")
    return image


def _name(dtype: mx.Dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]  # "mlx.core.float16" -> "float16"


def check_layer_input(x: Any, layer: str, *, spatial: bool, channels: int | None) -> None:
    """Refuse what a layer cannot take before any kernel sees it, so the message is the same on
    every path (CPU kernels, CUDA kernels, MLX): ``x`` must be an ``mx.array``, NHWC
    ``(N, H, W, channels)`` when ``spatial``, else ``(..., channels)``; ``channels=None``: any.
    Raises ShapeMismatchError (DTypeError for a non-array) naming ``layer`` and the shape."""
    want = (f"(N, H, W, {'C' if channels is None else channels})" if spatial
            else f"(..., {channels})")
    if not isinstance(x, mx.array):
        raise DTypeError(f"{layer} expects an mx.array {want}, got a {type(x).__name__}: "
                         "wrap it with mx.array(x)")
    shape = tuple(x.shape)
    if (x.ndim != 4 if spatial else x.ndim < 1) or (channels is not None
                                                     and shape[-1:] != (channels,)):
        hint = " (NHWC: x.transpose(0, 2, 3, 1) for NCHW)" if spatial and x.ndim == 4 else ""
        raise ShapeMismatchError(f"{layer} expects {want} input, got {shape}{hint}")
