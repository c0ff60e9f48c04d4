"""The safetensors metadata that converted checkpoints carry, and how to read it back.

safetensors metadata is a flat ``str -> str`` map. Every key we write starts with ``candle_nn.``;
values are plain strings except ``candle_nn.names`` (a JSON list). The CLIs read these keys to pick
the variant and the class labels by default (see weights/README.md for the table).

* ``candle_nn.model``: ``resnet`` | ``yolo_v8`` | ``yolo_v8_pose`` | ``yolo_v8_seg`` |
  ``yolo_v8_cls`` | ``yolo11`` | ``yolo11_pose`` | ``yolo11_seg`` | ``yolo11_cls`` |
  ``mobile_sam`` | ``sam``
* ``candle_nn.variant``: the registry variant (``resnet50``, ``n`` … ``x``, ``tiny``)
* ``candle_nn.task``: ``classify`` | ``detect`` | ``pose`` | ``segment``
* ``candle_nn.num_classes``: decimal class count (ResNet head, YOLOv8 classes)
* ``candle_nn.num_keypoints``: decimal keypoint count (YOLOv8 pose)
* ``candle_nn.names``: JSON list of class names in index order (``["person", "bicycle", …]``)
* ``candle_nn.source``: what it was converted from (``ultralytics:best.pt``)
* ``candle_nn.imgsz``, ``candle_nn.preprocess``: the training size and a classifier's stored
  transform (:mod:`candle_nn_models.training_size` reads and bounds them; kept in ``extra``)
* ``candle_nn.bn_eps``, ``candle_nn.bn_momentum``: the source's BatchNorm settings (read by
  ``candle_nn.BatchNorm2d.load``; kept in ``extra``)
* ``candle_nn.format``: ``1`` (bumped if the meaning of these keys ever changes)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Mapping

from candle_nn import WeightsFileError, open_safetensors

PREFIX = "candle_nn."
MODEL = PREFIX + "model"
VARIANT = PREFIX + "variant"
TASK = PREFIX + "task"
NUM_CLASSES = PREFIX + "num_classes"
NUM_KEYPOINTS = PREFIX + "num_keypoints"
NAMES = PREFIX + "names"
SOURCE = PREFIX + "source"
FORMAT = PREFIX + "format"
FORMAT_VERSION = "1"

TASKS = {"resnet": "classify", "yolo_v8": "detect", "yolo_v8_pose": "pose",
         "yolo_v8_seg": "segment", "yolo_v8_cls": "classify", "yolo11": "detect",
         "yolo11_pose": "pose", "yolo11_seg": "segment", "yolo11_cls": "classify",
         "mobile_sam": "segment",
         "sam": "segment"}


@dataclass(frozen=True)
class WeightsMetadata:
    """What a converted file says about itself; every field is ``None`` when not recorded."""

    model: str | None = None
    variant: str | None = None
    task: str | None = None
    num_classes: int | None = None
    num_keypoints: int | None = None
    names: list[str] | None = None
    source: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, str]:
        """The safetensors metadata map (only the fields that are set)."""
        out: dict[str, str] = {FORMAT: FORMAT_VERSION}
        for key, value in ((MODEL, self.model), (VARIANT, self.variant), (TASK, self.task),
                           (SOURCE, self.source)):
            if value is not None:
                out[key] = str(value)
        if self.num_classes is not None:
            out[NUM_CLASSES] = str(int(self.num_classes))
        if self.num_keypoints is not None:
            out[NUM_KEYPOINTS] = str(int(self.num_keypoints))
        if self.names is not None:
            out[NAMES] = json.dumps([str(n) for n in self.names], ensure_ascii=False)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, meta: Mapping[str, str] | None) -> "WeightsMetadata":
        """Parse a safetensors metadata map (unknown keys go to ``extra``; bad values → None)."""
        meta = dict(meta or {})
        names = None
        if NAMES in meta:
            try:
                parsed = json.loads(meta[NAMES])
                if isinstance(parsed, dict):  # tolerate ultralytics' {index: name} form
                    parsed = [parsed[k] for k in sorted(parsed, key=int)]
                if isinstance(parsed, list):
                    names = [str(n) for n in parsed]
            except (ValueError, KeyError, TypeError):
                names = None
        known = {MODEL, VARIANT, TASK, NUM_CLASSES, NUM_KEYPOINTS, NAMES, SOURCE, FORMAT}
        return cls(model=meta.get(MODEL), variant=meta.get(VARIANT), task=meta.get(TASK),
                   num_classes=_int_or_none(meta.get(NUM_CLASSES)),
                   num_keypoints=_int_or_none(meta.get(NUM_KEYPOINTS)), names=names,
                   source=meta.get(SOURCE),
                   extra={k: v for k, v in meta.items() if k not in known})


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def read_metadata(path: "str | os.PathLike") -> WeightsMetadata:
    """The ``candle_nn.*`` metadata of a safetensors file (all ``None`` for candle's own files).

    Reads only the header. Raises WeightsFileError for a missing or malformed file.
    """
    handle = open_safetensors(os.fspath(path))
    try:
        return WeightsMetadata.from_dict(handle.metadata())
    except Exception as exc:
        raise WeightsFileError(f"{path}: unreadable safetensors header ({exc})") from exc
