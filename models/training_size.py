"""The input a model was trained at, as its weights file records it: every entry point's default.

ultralytics predicts at a checkpoint's training size (``model.args["imgsz"]``), and a classifier
with the transforms its trainer stored (``model.transforms``); ``candle-resnet train`` evaluates at
its ``--imgsz``. The converter and the trainers record them in the safetensors metadata:

* ``candle_nn.imgsz``: the training size in pixels (a square side);
* ``candle_nn.preprocess``: a classifier's evaluation transform as JSON ``{"resize": R,
  "crop": C, "mean": [3 floats] | null, "std": [3 floats] | null}`` (shorter side resized to
  ``R``, bilinear; centre crop ``C``; ``/255``; ``(x - mean) / std``).

A file is data from anywhere, so both are checked before use: a size above :data:`MAX_IMGSZ`
(3000 px is 2.5 GB a ResNet image) is a WeightsFileError, never an out-of-memory kill.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from candle_nn import VarBuilder, WeightsFileError

IMGSZ_KEY = "candle_nn.imgsz"
PREPROCESS_KEY = "candle_nn.preprocess"
MIN_IMGSZ = 32  # the models downsample 32x
MAX_IMGSZ = 2048  # ultralytics trains at 640 (1280 at most); beyond, memory grows with its square
DEFAULT_SIZE = 640  # ultralytics' predict default for a file that records no training size
CLASSIFY_SIZE = 224  # a classifier's
MAX_YOLO_INPUT_SIZE = 4096  # a predict input's side: 6.5x 640 is 41x the work; more runs out


def check_imgsz(value: object, where: str) -> int:
    """``value`` as a training size in ``[MIN_IMGSZ, MAX_IMGSZ]`` pixels; WeightsFileError
    naming ``where`` otherwise."""
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            pass
    if not isinstance(value, int) or isinstance(value, bool) \
            or not MIN_IMGSZ <= value <= MAX_IMGSZ:
        raise WeightsFileError(
            f"{where}: training size {str(value)[:40]!r} is not a whole number of pixels in "
            f"{MIN_IMGSZ}..{MAX_IMGSZ}; re-convert the checkpoint, or pass the size explicitly "
            "(--size)")
    return value


def training_size(metadata: Mapping[str, str], where: str) -> int | None:
    """The training size a weights file records (``None`` when it records none), checked by
    :func:`check_imgsz`."""
    value = metadata.get(IMGSZ_KEY)
    return None if value is None else check_imgsz(value, f"{where} ({IMGSZ_KEY})")


@dataclass(frozen=True)
class ClassifyPreprocess:
    """A classifier's evaluation transform: shorter side to ``resize`` (bilinear), centre crop
    ``crop``, ``/255``, then ``(x - mean) / std`` (``None``: left in [0, 1])."""

    resize: int
    crop: int
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None

    def to_json(self) -> str:
        return json.dumps({"resize": self.resize, "crop": self.crop, "mean": self.mean,
                           "std": self.std})

    def arrays(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``(mean, std)`` as float32 arrays (or ``None``) for ``imagenet.preprocess``."""
        return tuple(None if v is None else np.array(v, np.float32)  # type: ignore[return-value]
                     for v in (self.mean, self.std))


def classify_preprocess(metadata: Mapping[str, str], where: str) -> ClassifyPreprocess | None:
    """The evaluation transform a classifier's file records (``None`` when none); a malformed
    record is a WeightsFileError."""
    text = metadata.get(PREPROCESS_KEY)
    if text is None:
        return None
    bad = f"{where}: malformed {PREPROCESS_KEY} metadata; re-convert the checkpoint"
    try:
        data = json.loads(text)
        resize = check_imgsz(data["resize"], f"{where} ({PREPROCESS_KEY} resize)")
        crop = check_imgsz(data["crop"], f"{where} ({PREPROCESS_KEY} crop)")
        stats = [None if data.get(k) is None else tuple(float(v) for v in data[k])
                 for k in ("mean", "std")]
    except (ValueError, KeyError, TypeError):
        raise WeightsFileError(bad) from None
    mean, std = stats
    if any(s is not None and (len(s) != 3 or not all(map(math.isfinite, s))) for s in stats) \
            or (std is not None and min(std) <= 0) or crop > resize:
        raise WeightsFileError(bad)
    return ClassifyPreprocess(resize, crop, mean, std)  # type: ignore[arg-type]


def with_training_input(model: Any, vb: VarBuilder, task: str) -> Any:
    """``model`` with the input it was trained at as every entry point's default (ultralytics'
    predict default): ``model.imgsz`` (the file's training size — a detector's rounded up to a
    multiple of 32 — else :data:`DEFAULT_SIZE`, or :data:`CLASSIFY_SIZE` for a classifier) and,
    for a classifier, ``model.preprocessing`` (the transform its trainer stored, or ``None``)."""
    where = "the weights"
    model.imgsz = default_size(vb.metadata, task, where)
    if task == "classify":
        model.preprocessing = classify_preprocess(vb.metadata, where)
    return model


def default_size(metadata: Mapping[str, str], task: str, where: str) -> int:
    """A YOLO model's default input size: the training size ``metadata`` records (a detector's
    rounded up to a multiple of 32, as ultralytics' ``check_imgsz``), else :data:`DEFAULT_SIZE`
    (:data:`CLASSIFY_SIZE` for ``task`` ``"classify"``)."""
    size = training_size(metadata, where) or (CLASSIFY_SIZE if task == "classify"
                                               else DEFAULT_SIZE)
    return size if task == "classify" else -(-size // 32) * 32
