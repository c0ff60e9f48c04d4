"""``candle-yolo-v8``'s predict options: generated from
:class:`~candle_nn_models.yolo.PredictOptions` (flags, defaults, help) and read back from the
parsed command line; and the pipeline's batch step (:func:`candle_nn_models.yolo.predict.
detect_batch`) with them, for ``--video``'s frame batches and the app."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from candle_nn_models.letterbox import Letterbox, letterbox
from candle_nn_models.yolo import PredictOptions
from candle_nn_models.yolo.predict import detect_batch
from candle_nn_models.yolo_v8 import YoloV8Spec
from candle_nn_models.yolo_v8_masks import InstanceMasks
from candle_nn_models.yolo_v8_post import Detection
from candle_nn_models.scripts.common import fraction, number_arg, positive, yolo_input_size


def _class_id(text: str) -> int:
    value = number_arg(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a class id (0, 1, 2, ...)")
    return value


# PredictOptions' value kinds -> the argparse keywords that parse them
_KINDS: dict[str, dict[str, Any]] = {
    "fraction": {"type": fraction}, "size": {"type": yolo_input_size},
    "count": {"type": positive(int)},
    "class_ids": {"type": _class_id, "nargs": "+", "metavar": "N"},
    "switch": {"action": "store_true"}}


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_predict_arguments(parser, group: str) -> None:
    """The options of :class:`PredictOptions` in help ``group`` (``main`` or ``ultralytics``),
    each with its field's flag, default and help."""
    for f in dataclasses.fields(PredictOptions):
        meta = f.metadata
        if meta["cli"] and meta["group"] == group:
            kind = dict(_KINDS[meta["kind"]])
            if meta["kind"] != "switch":
                kind["default"] = f.default
            parser.add_argument(meta["flag"], help=meta["help"].format(default=f.default),
                                **kind)


def predict_options(args: argparse.Namespace) -> dict[str, Any]:
    """``YOLO.predict``'s keyword arguments from the parsed command line."""
    return {f.name: getattr(args, _dest(f.metadata["flag"]))
            for f in dataclasses.fields(PredictOptions)}


def predict(args: argparse.Namespace, model, spec: YoloV8Spec, boxes: Sequence[Letterbox],
            weights: Path | None = None
            ) -> list[tuple[list[Detection], InstanceMasks | None]]:
    """:func:`~candle_nn_models.yolo.predict.detect_batch` with the command line's options."""
    return detect_batch(model, spec, boxes, PredictOptions(**predict_options(args)), weights)


def detect_image(model, spec: YoloV8Spec, rgb: np.ndarray,
                 weights: "str | Path", *, size: int | None = None, square: bool = False,
                 conf: float = 0.25, iou: float = 0.7, max_det: int = 300, agnostic: bool = False,
                 classes: Sequence[int] | None = None) -> list[Detection]:
    """The detections in one ``(H, W, 3)`` uint8 RGB image, in its pixels: letterboxed to
    ``size`` (default: the model's training size ``model.imgsz``; ``square``: padded to
    ``size x size``), the model's output checked finite (else an error naming ``weights``), then
    confidence filter and NMS as ultralytics' ``yolo predict``."""
    lb = letterbox(rgb, size or model.imgsz, auto=not square)
    options = PredictOptions(conf=conf, iou=iou, max_det=max_det, agnostic_nms=agnostic,
                             classes=classes)
    ((detections, _masks),) = detect_batch(model, spec, [lb], options, weights)
    return detections
