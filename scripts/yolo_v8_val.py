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

ultralytics' ``yolo val`` letterboxes each batch to its own rectangle and downsizes with
area interpolation; here every image is letterboxed as ``candle-yolo-v8`` predicts, so the
detections, and the metrics by a little, can differ from ``yolo val``'s. The same detections give
the same metrics.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from candle_nn import CandleNNError, model_dtype
import mlx.core as mx
import numpy as np

from candle_nn_models.letterbox import Letterbox, letterbox
from candle_nn_models.yolo_v8 import MULTIPLES
from candle_nn_models.yolo_v8_data import DataConfig, DataError, label_path, read_labels
from candle_nn_models.yolo_v8_metrics import DetectionMetrics
from candle_nn_models.yolo_v8_post import validation_detections
from candle_nn_models.scripts.common import (add_device_argument, check_finite, compile_choice,
                                             fraction, ImageInputError, load_rgb, parse_device,
                                             positive, run_main, shown, yolo_input_size)

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
    parser.add_argument("--imgsz", type=yolo_input_size, default=640, metavar="PX",
                        help="square input side, a multiple of 32 (default 640)")
    parser.add_argument("--batch", type=positive(int), default=16, metavar="N",
                        help="images per model call (default 16)")
    parser.add_argument("--conf", type=fraction, default=0.001,
                        help="minimum class score of a detection (default 0.001, ultralytics' "
                             "for validation)")
    parser.add_argument("--iou", type=fraction, default=0.7,
                        help="NMS IoU threshold (default 0.7, ultralytics' for validation)")
    parser.add_argument("--max-det", type=positive(int), default=300, metavar="N",
                        help="detections kept per image (default 300)")
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


def ground_truth_in_input(lb: Letterbox, boxes_xyxy: np.ndarray) -> np.ndarray:
    """Original-image pixel boxes → the letterboxed input's pixels (as ultralytics moves the
    labels with the image)."""
    h, w = lb.orig_hw
    unpad_w, unpad_h = max(1, int(round(w * lb.scale))), max(1, int(round(h * lb.scale)))
    gain = np.float32([unpad_w / w, unpad_h / h] * 2)
    return boxes_xyxy * gain + np.float32([lb.pad[0], lb.pad[1]] * 2)


def validate(args: argparse.Namespace) -> DetectionMetrics:
    """Score the model on the split; warnings go to stderr."""
    from candle_nn_models.scripts.yolo_v8_weights import load_detector

    data = DataConfig.load(args.data)
    images = data.images(args.split)
    device = parse_device(args.device, args.verbose)
    model, spec, _, weights = load_detector(args.weights, "detect", args.variant, device,
                                            "float16" if args.half else "float32")
    if spec.num_classes != len(data.names):
        raise CandleNNError(f"{data.path} names {len(data.names)} classes but {shown(weights)} "
                            f"predicts {spec.num_classes}: pass the weights trained on this data")
    model.set_compiled(compile_choice(args.compile))
    metrics = DetectionMetrics(data.names)
    for start in range(0, len(images), args.batch):
        batch = []
        for image in images[start:start + args.batch]:
            try:
                rgb = load_rgb(image)
            except ImageInputError as exc:
                print(f"warning: {exc}; image skipped", file=sys.stderr)
                continue
            labels, problems = read_labels(label_path(image), len(data.names))
            for problem in problems:
                print(f"warning: {problem}", file=sys.stderr)
            lb = letterbox(rgb, args.imgsz)
            batch.append((lb, labels))
        if not batch:
            continue
        x = mx.array(np.concatenate([lb.as_input() for lb, _ in batch]))
        pred = np.array(model(x.astype(model_dtype(model))).astype(mx.float32))
        check_finite(pred, weights)
        for p, (lb, labels) in zip(pred, batch):
            boxes, scores, classes = detections(p, spec.num_classes, args.conf, args.iou,
                                                args.max_det)
            h, w = lb.orig_hw
            gt = ground_truth_in_input(lb, labels.xyxy(w, h))
            metrics.update(boxes, scores, classes, gt, labels.classes)
    return metrics


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        metrics = validate(args)
    except DataError as exc:
        raise CandleNNError(str(exc)) from None
    results = metrics.results()
    if args.json:
        print(json.dumps({"data": str(Path(args.data)), "split": args.split,
                          **results.to_dict()}, indent=2))
    else:
        print(results.table())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``candle-yolo-v8 val ...``."""
    return run_main(_main, argv)
