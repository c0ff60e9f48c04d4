"""One forward pass of a YOLOv8 detect, pose or segment model over letterboxed images and
ultralytics' post-processing, with the command line's options: what ``candle-yolo-v8`` runs per
image and per video batch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from candle_nn import model_dtype
import mlx.core as mx
import numpy as np

from candle_nn_models.letterbox import Letterbox, letterbox
from candle_nn_models.yolo_v8 import YoloV8Spec
from candle_nn_models.yolo_v8_masks import InstanceMasks, segment_postprocess
from candle_nn_models.yolo_v8_post import Detection, postprocess
from candle_nn_models.scripts.common import check_finite


def predict(args: argparse.Namespace, model, spec: YoloV8Spec, boxes: Sequence[Letterbox],
            weights: Path | None = None
            ) -> list[tuple[list[Detection], InstanceMasks | None]]:
    """Per letterboxed image, its detections (``--conf``, ``--iou``, ``--max-det``,
    ``--agnostic-nms``, ``--classes``) and, for segmentation, their masks at ultralytics'
    resolution (``--retina-masks``; each detection also holds its mask on the original image).
    A non-finite prediction is an error naming ``weights`` (when given)."""
    x = mx.array(np.concatenate([lb.as_input() for lb in boxes])).astype(model_dtype(model))
    out = model(x)
    pred = out[0] if spec.task == "segment" else out
    pred = np.array(pred.astype(mx.float32))
    if weights is not None:
        check_finite(pred, weights)
    nms = dict(conf=args.conf, iou=args.iou, max_det=args.max_det, agnostic=args.agnostic_nms,
               classes=args.classes)
    if spec.task == "segment":
        protos = np.array(out[1].astype(mx.float32))
        return segment_postprocess(pred, protos, list(boxes), num_classes=spec.num_classes,
                                   num_masks=spec.num_masks, retina=args.retina_masks, **nms)
    return [(dets, None) for dets in postprocess(pred, list(boxes), num_classes=spec.num_classes,
                                                 num_keypoints=spec.num_keypoints, **nms)]


def detect_image(model, spec: YoloV8Spec, rgb: np.ndarray,
                 weights: "str | Path", *, size: int | None = None, square: bool = False,
                 conf: float = 0.25, iou: float = 0.7, max_det: int = 300, agnostic: bool = False,
                 classes: Sequence[int] | None = None) -> list[Detection]:
    """The detections in one ``(H, W, 3)`` uint8 RGB image, in its pixels: letterboxed to
    ``size`` (default: the model's training size ``model.imgsz``; ``square``: padded to
    ``size x size``), the model's output checked finite (else an error naming ``weights``), then
    confidence filter and NMS as ultralytics' ``yolo predict``."""
    lb = letterbox(rgb, size or model.imgsz, auto=not square)
    opts = argparse.Namespace(conf=conf, iou=iou, max_det=max_det, agnostic_nms=agnostic,
                              classes=classes, retina_masks=False)
    ((detections, _masks),) = predict(opts, model, spec, [lb], weights)
    return detections
