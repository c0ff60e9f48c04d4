"""What ``YOLO.predict`` gives per image, as ultralytics' ``Results``: boxes, masks, keypoints
or class probabilities in the original image's pixels, the JSON record ``candle-yolo-v8 --json``
prints for it, and the drawing the CLI saves."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from candle_nn import CandleNNError

from candle_nn_models.image_file import shown
from candle_nn_models.yolo_v8_masks import InstanceMasks
from candle_nn_models.yolo_v8_post import Detection

from .draw import draw_detections

__all__ = ["Boxes", "Result", "top_classes"]


def top_classes(probs: np.ndarray, k: int) -> list[tuple[int, float]]:
    """``(class index, probability)`` of the ``k`` best classes, best first (ties: lower index)."""
    return [(int(i), float(probs[i])) for i in np.argsort(-probs, kind="stable")[:k]]


@dataclass(frozen=True)
class Boxes:
    """One image's boxes, best score first: ``xyxy`` ``(N, 4)`` float32 original-image pixels,
    ``conf`` ``(N,)`` float32 scores, ``cls`` ``(N,)`` int64 class ids."""

    xyxy: np.ndarray
    conf: np.ndarray
    cls: np.ndarray

    def __len__(self) -> int:
        return len(self.conf)


@dataclass
class Result:
    """One image's predictions.

    Attributes:
        orig_img: the ``(H, W, 3)`` uint8 RGB image the model saw (before letterboxing);
            ``None`` for images letterboxed elsewhere (``YOLO.predict_letterboxed``), whose
            ``orig_hw`` then gives the original's size.
        path: the file it came from (``None`` for an array or PIL image).
        names: class names, one per class id.
        detections: detect, pose and segment models: the kept detections, best first (each with
            its keypoints or its mask on the original image).
        masks: segment models: the masks at ultralytics' resolution (``masks.data`` ``(N, h,
            w)`` uint8; ``retina_masks``: the original image's), for polygons.
        probs: classify models: ``(num_classes,)`` float32 probabilities.
        top_k: how many classes :meth:`to_json` lists for a classifier.
        skeleton: the keypoint pairs :meth:`plot` joins (COCO's for 17-keypoint pose models).
        orig_hw: the original ``(height, width)`` when there is no ``orig_img``.
    """

    orig_img: np.ndarray | None
    path: Path | None
    names: Sequence[str]
    detections: list[Detection] | None = None
    masks: InstanceMasks | None = None
    probs: np.ndarray | None = None
    top_k: int = 5
    skeleton: Sequence[tuple[int, int]] = field(default=(), repr=False)
    orig_hw: tuple[int, int] | None = None

    @property
    def orig_shape(self) -> tuple[int, int]:
        """The original image's ``(height, width)``."""
        if self.orig_img is None:
            return int(self.orig_hw[0]), int(self.orig_hw[1])
        return int(self.orig_img.shape[0]), int(self.orig_img.shape[1])

    @property
    def boxes(self) -> Boxes | None:
        """The detections' boxes (``None`` for a classifier)."""
        if self.detections is None:
            return None
        dets = self.detections
        return Boxes(np.array([d.box_xyxy for d in dets], np.float32).reshape(-1, 4),
                     np.array([d.score for d in dets], np.float32),
                     np.array([d.class_id for d in dets], np.int64))

    @property
    def keypoints(self) -> np.ndarray | None:
        """Pose models: ``(N, K, 3)`` float32 ``x, y, visibility`` in original pixels."""
        if not self.detections or self.detections[0].keypoints is None:
            return None
        return np.stack([d.keypoints for d in self.detections]).astype(np.float32)

    def to_json(self, output: "str | os.PathLike | None" = None) -> dict:
        """The record ``candle-yolo-v8 --json`` prints for this image (``output``: the drawing's
        file, which the CLI adds): ``image``, ``height``, ``width`` and ``detections`` (each
        ``class_id``, ``class_name``, ``score``, ``box_xyxy``, with ``keypoints`` or a COCO RLE
        ``segmentation``); a classifier's ``image`` and ``top_k`` (``index``, ``label``,
        ``probability``)."""
        image = None if self.path is None else shown(self.path)
        if self.probs is not None:
            top = top_classes(self.probs, min(self.top_k, len(self.probs)))
            return {"image": image, "top_k": [{"index": i, "label": self.names[i],
                                               "probability": p} for i, p in top]}
        record = {"image": image}
        if output is not None:
            record["output"] = shown(output)
        h, w = self.orig_shape
        record.update(height=h, width=w,
                      detections=[d.to_dict(self.names) for d in self.detections or []])
        return record

    def plot(self, *, line_width: int | None = None, labels: bool = True,
             conf: bool = True) -> np.ndarray:
        """The image with the detections drawn, ``(H, W, 3)`` uint8 RGB, as ``candle-yolo-v8``
        saves it (``line_width``, ``labels=False``, ``conf=False``: its ``--line-width``,
        ``--hide-labels``, ``--hide-conf``)."""
        if self.detections is None:
            raise CandleNNError("plot draws detections, and a classifier has none: read its "
                                "classes from result.probs or result.to_json()")
        if self.orig_img is None:
            raise CandleNNError("plot draws on the original image, and this result was "
                                "predicted from a letterboxed input without it: predict from "
                                "the image itself (YOLO.predict or predict_batch)")
        drawing = draw_detections(self.orig_img, self.detections, self.names, self.skeleton,
                                  line_width=line_width, labels=labels, scores=conf)
        return np.asarray(drawing, dtype=np.uint8)
