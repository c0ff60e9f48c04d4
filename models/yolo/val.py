"""YOLO detection validation, once: ultralytics' validation NMS (every (anchor, class) scoring
above ``conf``, class-aware NMS at ``iou``, ``max_det`` kept) on a detector's predictions, scored
against the labels in the input's pixels by :class:`DetectionMetrics` (P, R, mAP50, mAP50-95).

:class:`Validator` (``yolo_v8_validator.py``, below the task API so the trainer's validation
can feed it its own letterboxed samples) takes batches of predictions and labels.
:func:`validate` (``YOLO.val``, and ``candle-yolo-v8 val`` its client) reads a ``data.yaml``
split, letterboxes each image square to ``imgsz`` and feeds it.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from candle_nn import CandleNNError
import numpy as np

from candle_nn_models.image_file import ImageInputError, load_rgb, shown
from candle_nn_models.letterbox import Letterbox, letterbox
from candle_nn_models.yolo_v8_data import DataConfig, DataError, label_path, read_labels
from candle_nn_models.yolo_v8_metrics import DetectionResults
from candle_nn_models.yolo_v8_validator import (VAL_BATCH, VAL_CONF, VAL_IMGSZ, VAL_IOU,
                                                VAL_MAX_DET, Validator)

from .options import PredictOptions
from .predict import forward

__all__ = ["VAL_BATCH", "VAL_CONF", "VAL_IMGSZ", "VAL_IOU", "VAL_MAX_DET", "Validator",
           "ground_truth_in_input", "read_split", "validate"]

def ground_truth_in_input(lb: Letterbox, boxes_xyxy: np.ndarray) -> np.ndarray:
    """Original-image pixel boxes ``(L, 4)`` → the letterboxed input's pixels (as ultralytics
    moves the labels with the image)."""
    h, w = lb.orig_hw
    unpad_w, unpad_h = max(1, int(round(w * lb.scale))), max(1, int(round(h * lb.scale)))
    gain = np.float32([unpad_w / w, unpad_h / h] * 2)
    return boxes_xyxy * gain + np.float32([lb.pad[0], lb.pad[1]] * 2)


def read_split(data: "str | os.PathLike", split: str = "val") -> tuple[DataConfig, list]:
    """The parsed ``data`` (a data.yaml) and the image files of its ``split``; a missing or
    malformed file or split is one CandleNNError."""
    try:
        config = DataConfig.load(data)
        return config, config.images(split)
    except DataError as exc:
        raise CandleNNError(str(exc)) from None


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def validate(model, num_classes: int, weights: "str | os.PathLike", data: "str | os.PathLike",
             *, split: str = "val", imgsz: int = VAL_IMGSZ, batch: int = VAL_BATCH,
             conf: float = VAL_CONF, iou: float = VAL_IOU, max_det: int = VAL_MAX_DET,
             warn: Callable[[str], None] = _warn) -> DetectionResults:
    """The detector ``model`` (``num_classes`` classes, loaded from ``weights``) scored on the
    ``split`` of ``data`` (a data.yaml): each image letterboxed to ``imgsz`` square, ``batch``
    images a forward pass (its output checked finite). An unreadable image or a malformed label
    line is one ``warn`` (default: a ``warning:`` line on stderr) and skipped."""
    PredictOptions(conf=conf, iou=iou, imgsz=imgsz, max_det=max_det)  # checks them
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise CandleNNError(f"batch={batch!r}: pass a whole number >= 1")
    config, images = read_split(data, split)
    if num_classes != len(config.names):
        raise CandleNNError(f"{config.path} names {len(config.names)} classes but "
                            f"{shown(weights)} predicts {num_classes}: pass the weights trained "
                            "on this data")
    validator = Validator(config.names, conf, iou, max_det)
    for start in range(0, len(images), batch):
        boxes, labels = [], []
        for image in images[start:start + batch]:
            try:
                rgb = load_rgb(image)
            except ImageInputError as exc:
                warn(f"{exc}; image skipped")
                continue
            found, problems = read_labels(label_path(image), len(config.names))
            for problem in problems:
                warn(problem)
            boxes.append(letterbox(rgb, imgsz))
            labels.append(found)
        if not boxes:
            continue
        pred, _ = forward(model, "detect", boxes, weights)
        validator.update(pred, [(ground_truth_in_input(lb, found.xyxy(*lb.orig_hw[::-1])),
                                 found.classes) for lb, found in zip(boxes, labels)])
    return validator.results()
