"""What an ultralytics checkpoint says about its input: the training size (``model.args`` /
``train_args`` ``imgsz``, ultralytics' predict default) and a classifier's stored evaluation
transforms (``model.transforms``, a torchvision ``Compose`` its trainer attaches), read as plain
data from the restricted unpickler's inert stand-ins: nothing of torchvision is imported or run.

The transforms ultralytics' ``classify_transforms`` builds are understood — ``Resize(int)``
(bilinear), ``CenterCrop``, ``ToTensor``, ``Normalize`` — and become the converted file's
preprocessing (:class:`candle_nn_models.training_size.ClassifyPreprocess`); any other transform
is a ConversionError naming it, never silently dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from candle_nn import CandleNNError
from candle_nn_models.training_size import ClassifyPreprocess, check_imgsz

from .torch_pickle import ConversionError, StandIn


def _state(obj: Any) -> dict[str, Any]:
    """A stand-in's pickled attributes (a plain dict as itself)."""
    if isinstance(obj, dict):
        return obj
    return dict(getattr(obj, "__dict__", {})) if isinstance(obj, StandIn) else {}


def training_imgsz(ckpt: Any, model: Any, where: str) -> int | None:
    """The square training size of an unpickled ultralytics file (``model.args`` first, as
    ultralytics' predictor reads it, then the checkpoint's ``train_args``), ``None`` when it
    records none; a non-square ``[h, w]`` gives its longer side (the letterbox's)."""
    places = [_state(model).get("args"), ckpt.get("train_args") if isinstance(ckpt, dict)
              else None]
    for place in places:
        value = _state(place).get("imgsz")
        if value is None:
            continue
        if isinstance(value, (list, tuple)) and value:
            value = max(value) if all(isinstance(v, int) for v in value) else value
        try:
            return check_imgsz(value, f"{where}: model.args imgsz")
        except CandleNNError as exc:
            raise ConversionError(str(exc)) from None
    return None


def _name(obj: Any) -> str:
    return getattr(obj, "qualname", type(obj).__name__).rsplit(".", 1)[-1]


def _stats(value: Any, what: str, where: str) -> tuple[float, float, float] | None:
    values = np.asarray(value, dtype=np.float64).reshape(-1)
    if values.size == 1:
        values = np.repeat(values, 3)
    if values.size != 3 or not np.isfinite(values).all():
        raise ConversionError(f"{where}: the stored Normalize {what} {value!r} is not 3 numbers")
    return tuple(float(v) for v in values)  # type: ignore[return-value]


def classify_preprocess(model: Any, where: str) -> ClassifyPreprocess | None:
    """The evaluation transform of a pickled ultralytics classifier (``model.transforms``),
    ``None`` when the file holds none (YAML-built models, state_dicts)."""
    compose = _state(model).get("transforms")
    if compose is None:
        return None
    steps = _state(compose).get("transforms")
    if _name(compose) != "Compose" or not isinstance(steps, list):
        raise ConversionError(f"{where}: model.transforms is a {_name(compose)}, not the "
                              "torchvision Compose ultralytics' trainer stores")
    resize = crop = None
    mean = std = None
    for step in steps:
        kind, state = _name(step), _state(step)
        if kind == "Resize":
            size, mode = state.get("size"), state.get("interpolation")
            # an InterpolationMode (an Enum pickled by value: the stand-in keeps ("bilinear",)),
            # or, from torchvision < 0.9, PIL's filter number (2: bilinear)
            mode = ("bilinear",) if mode in (None, 2) else tuple(_state(mode).get("args") or ())
            if isinstance(size, (list, tuple)) and len(size) == 1:
                size = size[0]
            if not isinstance(size, int) or mode[:1] != ("bilinear",):
                raise ConversionError(
                    f"{where}: the stored Resize(size={size!r}, interpolation={mode[:1]!r}) is "
                    "not the shorter side to N, bilinear (ultralytics' classify_transforms of a "
                    "square size), the only resize candle_nn reproduces")
            resize = size
        elif kind == "CenterCrop":
            size = state.get("size")
            size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
            if len(size) != 2 or size[0] != size[1] or not isinstance(size[0], int):
                raise ConversionError(f"{where}: the stored CenterCrop size {size!r} is not "
                                      "square; candle_nn's classifiers crop squares")
            crop = size[0]
        elif kind == "Normalize":
            mean, std = (_stats(state.get(k), k, where) for k in ("mean", "std"))
        elif kind != "ToTensor":
            raise ConversionError(
                f"{where}: model.transforms holds a {kind}, which candle_nn does not reproduce "
                "(it reads Resize, CenterCrop, ToTensor, Normalize)")
    if resize is None or crop is None:
        raise ConversionError(f"{where}: model.transforms has no Resize and CenterCrop")
    if mean == (0.0, 0.0, 0.0) and std == (1.0, 1.0, 1.0):
        mean = std = None  # ultralytics' default: no normalisation
    try:
        return ClassifyPreprocess(check_imgsz(resize, f"{where}: Resize"),
                                  check_imgsz(crop, f"{where}: CenterCrop"), mean, std)
    except CandleNNError as exc:
        raise ConversionError(str(exc)) from None
