"""YOLO detection validation's scoring, once: ultralytics' validation NMS (every (anchor, class)
scoring above ``conf``, class-aware NMS at ``iou``, ``max_det`` kept) on a detector's
predictions, scored against labels in the input's pixels by :class:`DetectionMetrics`. The
trainer's validation and ``YOLO.val`` (models/yolo/val.py) both feed a :class:`Validator`.
"""

from __future__ import annotations

from typing import Sequence

from candle_nn import CandleNNError
import numpy as np

from .yolo_v8_metrics import DetectionMetrics, DetectionResults
from .yolo_v8_post import validation_detections

__all__ = ["VAL_BATCH", "VAL_CONF", "VAL_IMGSZ", "VAL_IOU", "VAL_MAX_DET", "Validator"]

# ultralytics' validation defaults (its default.yaml: conf 0.001 when validating, iou 0.7)
VAL_CONF, VAL_IOU, VAL_MAX_DET, VAL_IMGSZ, VAL_BATCH = 0.001, 0.7, 300, 640, 16


class Validator:
    """Accumulates ultralytics' detection metrics over batches.

    Args:
        names: class names (index = class id; the prediction's class count).
        conf, iou, max_det: the validation NMS's (ultralytics' 0.001, 0.7, 300).
    """

    def __init__(self, names: Sequence[str], conf: float = VAL_CONF, iou: float = VAL_IOU,
                 max_det: int = VAL_MAX_DET) -> None:
        self.metrics = DetectionMetrics(names)
        self.num_classes = len(self.metrics.names)
        self.conf, self.iou, self.max_det = conf, iou, max_det

    def update(self, pred: np.ndarray,
               ground_truth: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """Add a batch: ``pred`` ``(B, 4 + nc, A)`` float32, the detector's output on ``B``
        inputs; per input its labels ``(boxes (L, 4) xyxy in input pixels, classes (L,))``."""
        if len(pred) != len(ground_truth):
            raise CandleNNError(f"{len(pred)} predictions but {len(ground_truth)} label sets: "
                                "pass one (boxes, classes) pair per input")
        for p, (gt_boxes, gt_classes) in zip(pred, ground_truth):
            boxes, scores, classes = validation_detections(p, self.num_classes, self.conf,
                                                           self.iou, self.max_det)
            self.metrics.update(boxes, scores, classes, gt_boxes, gt_classes)

    def results(self) -> DetectionResults:
        """P, R, mAP50 and mAP50-95 overall and per class, over everything added."""
        return self.metrics.results()
