"""``candle-yolo-v8 val``: a detector's precision, recall, mAP50 and mAP50-95 on a labelled set.

    candle-yolo-v8 val --data data.yaml [--weights FILE | --variant n] [--split val]
                       [--imgsz 640] [--batch 16] [--conf 0.001] [--iou 0.7] [--max-det 300]
                       [--half] [--device cpu] [--json]

Reads the split's images and YOLO labels (see ``models/yolo_v8_data.py`` for ``data.yaml``),
runs the model on each image letterboxed to ``--imgsz`` square, keeps every (box, class) whose
score is above ``--conf`` (several classes per box, as ultralytics' validation), suppresses
overlaps per class above ``--iou`` and keeps ``--max-det``; then scores the detections as
ultralytics' validator does (``models/yolo_v8_metrics.py``) and prints its table: per class the
images holding it, its boxes, P, R, mAP50 and mAP50-95, and ``all`` over the classes with labels.
``--json`` prints the same as one JSON document. Unreadable images and malformed label lines are
skipped with one warning each on stderr.

The validation is the YOLO task API's (``YOLO.val``, ``models/yolo/val.py``), which the trainer's
validation shares; this program parses the options and prints the result.

ultralytics' ``yolo val`` letterboxes each batch to its own rectangle and downsizes with
area interpolation; here every image is letterboxed as ``candle-yolo-v8`` predicts, so the
detections, and the metrics by a little, can differ from ``yolo val``'s. The same detections give
the same metrics.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from candle_nn_models.yolo.val import (VAL_BATCH, VAL_CONF, VAL_IMGSZ, VAL_IOU, VAL_MAX_DET,
                                       ground_truth_in_input, read_split)
from candle_nn_models.yolo_v8 import MULTIPLES
from candle_nn_models.yolo_v8_metrics import DetectionResults
from candle_nn_models.yolo_v8_post import validation_detections
from candle_nn_models.scripts.common import (add_device_argument, compile_choice, fraction,
                                             parse_device, positive, run_main, yolo_input_size)

__all__ = ["build_parser", "detections", "ground_truth_in_input", "main", "validate"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="candle-yolo-v8 val",
        description="P, R, mAP50 and mAP50-95 of a YOLOv8 detector on a labelled data set "
                    "(ultralytics' validation metrics).")
    parser.add_argument("--data", required=True, metavar="YAML",
                        help="data.yaml: path, train/val (image folders or lists), names")
    parser.add_argument("--split", default="val", choices=("val", "train", "test"),
                        help="which split to score (default: val)")
    parser.add_argument("--weights", default=None, metavar="FILE",
                        help="a YOLOv8 detector's safetensors (default: candle's published "
                             "yolov8{variant})")
    parser.add_argument("--variant", choices=tuple(MULTIPLES), default=None,
                        help="model size when --weights is not given (default: n)")
    parser.add_argument("--imgsz", type=yolo_input_size, default=VAL_IMGSZ, metavar="PX",
                        help=f"square input side, a multiple of 32 (default {VAL_IMGSZ})")
    parser.add_argument("--batch", type=positive(int), default=VAL_BATCH, metavar="N",
                        help=f"images per model call (default {VAL_BATCH})")
    parser.add_argument("--conf", type=fraction, default=VAL_CONF,
                        help=f"minimum class score of a detection (default {VAL_CONF}, "
                             "ultralytics' for validation)")
    parser.add_argument("--iou", type=fraction, default=VAL_IOU,
                        help=f"NMS IoU threshold (default {VAL_IOU}, ultralytics' for "
                             "validation)")
    parser.add_argument("--max-det", type=positive(int), default=VAL_MAX_DET, metavar="N",
                        help=f"detections kept per image (default {VAL_MAX_DET})")
    parser.add_argument("--half", action="store_true", help="run the model in float16")
    parser.add_argument("--json", action="store_true",
                        help="print the metrics as one JSON document on stdout")
    add_device_argument(parser)
    return parser


def detections(pred: np.ndarray, num_classes: int, conf: float, iou: float,
               max_det: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`~candle_nn_models.yolo_v8_post.validation_detections` (ultralytics' validation
    NMS) of one image's ``(4 + nc, A)`` prediction."""
    return validation_detections(pred, num_classes, conf, iou, max_det)


def validate(args: argparse.Namespace) -> DetectionResults:
    """``YOLO.val`` of the detector the command line names, with its options; warnings go to
    stderr."""
    from candle_nn_models.scripts.yolo_v8_weights import load_yolo

    read_split(args.data, args.split)  # a bad data.yaml is named before any weights load
    device = parse_device(args.device, args.verbose)
    model = load_yolo(args.weights, "detect", args.variant, device,
                      "float16" if args.half else "float32")
    model.model.set_compiled(compile_choice(args.compile))
    return model.val(args.data, split=args.split, imgsz=args.imgsz, batch=args.batch,
                     conf=args.conf, iou=args.iou, max_det=args.max_det, half=args.half)


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    results = validate(args)
    if args.json:
        print(json.dumps({"data": str(Path(args.data)), "split": args.split,
                          **results.to_dict()}, indent=2))
    else:
        print(results.table())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``candle-yolo-v8 val ...``."""
    return run_main(_main, argv)
