"""``candle-yolo-v8``: detect objects (or people's poses) with YOLOv8 and draw them.

    candle-yolo-v8 --image bike.jpg [DIR 'photos/*.jpg' - ...] [--recursive] [--strict]
                   [--task detect|pose] [--variant n|s|m|l|x] [--weights FILE] [--conf 0.25]
                   [--iou 0.45] [--size 640] [--square] [--device cpu] [--out DIR]
                   [--max-pixels N] [--json]

For each image, writes ``<stem>_detect<ext>`` (or ``_pose``) into ``--out`` (all files of a run
are renamed into place together at its end; a failed run leaves none): boxes with class
names and scores, and skeletons for pose. Prints the detections (``--json``: one JSON document
on stdout). Without ``--weights`` the default is candle's published ``yolov8{variant}[-pose]``
checkpoint (variant ``n``); with ``--weights`` the variant, task and class count are read from the
file, and a ``--variant``/``--task`` that disagrees is an error. Class names come from the file's
``candle_nn.names`` metadata when present, else COCO's.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from candle_nn import CandleNNError, Device, VarBuilder, WeightsFileError  # before mlx: BLAS choice
import mlx.core as mx  # noqa: I001
import numpy as np

from models.coco import COCO_SKELETON, coco_class_names
from models.letterbox import letterbox
from models.yolo_v8 import MULTIPLES, YoloV8, YoloV8Pose, YoloV8Spec, infer_spec, load_model
from models.yolo_v8_post import Detection, postprocess
from scripts.batch import Batch
from scripts.common import (add_device_argument, add_input_arguments, check_finite, load_rgb,
                            parse_device, run_main, shown)
from scripts.outputs import OutputFolder
from scripts.yolo_v8_draw import draw_detections
from weights.metadata import WeightsMetadata
from weights.registry import resolve_weights

SAVE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}  # others are written as PNG
MAX_SIZE = 4096  # --size: 6.5x YOLOv8's 640 on a side is 41x the work; beyond, memory runs out


@dataclass
class ImageResult:
    """What the CLI found in one image and where it wrote the drawing."""

    image: Path
    output: Path
    size_hw: tuple[int, int]
    detections: list[Detection]

    def to_dict(self, names: Sequence[str]) -> dict:
        return {"image": shown(self.image), "output": shown(self.output),
                "height": self.size_hw[0], "width": self.size_hw[1],
                "detections": [d.to_dict(names) for d in self.detections]}


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not in [0, 1]")
    return value


def _size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0 or value % 32:
        raise argparse.ArgumentTypeError(f"{text} is not a positive multiple of 32")
    if value > MAX_SIZE:
        raise argparse.ArgumentTypeError(
            f"{text} is above {MAX_SIZE}: YOLOv8 is trained at 640, and the work grows with the "
            "square of the size (try 640, 1280 or at most 4096)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="candle-yolo-v8",
        description="Detect objects (or human poses) with YOLOv8 and write annotated images.")
    add_input_arguments(parser, what="detections")
    parser.add_argument("--task", choices=("detect", "pose"), default=None,
                        help="detect (boxes) or pose (boxes + keypoints); default: what --weights "
                             "holds, else detect")
    parser.add_argument("--variant", choices=tuple(MULTIPLES), default=None,
                        help="model size; default: what --weights holds, else n")
    parser.add_argument("--weights", default=None,
                        help="YOLOv8 safetensors file in candle's layout (default: candle's "
                             "yolov8{variant}[-pose].safetensors from the Hugging Face hub)")
    parser.add_argument("--conf", type=_fraction, default=0.25,
                        help="minimum class score (default 0.25)")
    parser.add_argument("--iou", type=_fraction, default=0.45,
                        help="NMS IoU threshold (default 0.45)")
    parser.add_argument("--size", type=_size, default=640,
                        help=f"longest side of the model input, a multiple of 32 up to {MAX_SIZE} "
                             "(default 640)")
    parser.add_argument("--square", action="store_true",
                        help="pad every input to size x size "
                             "(default: pad only up to a multiple of 32)")
    add_device_argument(parser)
    parser.add_argument("--out", default="out", help="output folder (default: ./out)")
    return parser


def load_detector(weights: "str | Path | None", task: str | None, variant: str | None,
                  device: Device) -> tuple[YoloV8 | YoloV8Pose, YoloV8Spec, list[str], Path]:
    """The model in ``weights`` (default: the published checkpoint of ``task``/``variant``),
    checked against the requested ``task``/``variant``; plus its class names and file."""
    if weights is None:  # the published checkpoint must then be exactly what was asked for
        task, variant = task or "detect", variant or "n"
    path = resolve_weights("yolo_v8_pose" if task == "pose" else "yolo_v8", variant or "n", weights)
    vb = VarBuilder.from_safetensors(path, device=device)
    try:
        spec = infer_spec(vb, name=str(path))
    except WeightsFileError as exc:
        raise WeightsFileError(f"{exc}. Pass YOLOv8 weights with --weights") from None
    wrong = [f"--{flag} {want}" for flag, want, have in
             (("task", task, spec.task), ("variant", variant, spec.variant))
             if want is not None and want != have]
    if wrong:
        raise CandleNNError(f"{path} holds {spec}, which does not match {' '.join(wrong)}: "
                            "drop the option to use this file, or pass matching --weights")
    names = WeightsMetadata.from_dict(vb.metadata).names or list(coco_class_names())
    if len(names) < spec.num_classes:  # e.g. a custom model without names: number the rest
        names = list(names) + [str(i) for i in range(len(names), spec.num_classes)]
    return load_model(vb, spec), spec, names, path


def output_name(image: Path, task: str) -> str:
    """``<stem>_<task><ext>`` (the output folder numbers a name already taken in the run)."""
    suffix = image.suffix.lower() if image.suffix.lower() in SAVE_SUFFIXES else ".png"
    return f"{image.stem}_{task}{suffix}"


def detect(args: argparse.Namespace, batch: Batch) -> None:
    """Run the CLI's work for parsed ``args``: each image's detections into ``batch``."""
    paths = batch.start()
    if not paths:
        return
    device = parse_device(args.device, args.verbose)
    model, spec, names, weights = load_detector(args.weights, args.task, args.variant, device)
    batch.doc.update({"model": str(spec), "task": spec.task})
    batch.output = OutputFolder(args.out)  # after the weights: a failed load creates no folder
    skeleton = COCO_SKELETON if spec.task == "pose" and spec.num_keypoints == 17 else ()
    for image in batch.progress(paths):
        with batch.image(image):
            rgb = load_rgb(image, args.max_pixels)
            lb = letterbox(rgb, args.size, auto=not args.square)
            pred = model(mx.array(lb.as_input()))
            check_finite(np.array(pred), weights)
            detections = postprocess(pred, [lb], num_classes=spec.num_classes, conf=args.conf,
                                     iou=args.iou)[0]
            drawing = draw_detections(rgb, detections, names, skeleton)
            out = batch.output.save_image(drawing, output_name(image, spec.task))
            result = ImageResult(image, out, rgb.shape[:2], detections)
            batch.done(result.to_dict(names), _result_lines(result, names))


def _result_lines(result: ImageResult, names: Sequence[str]) -> list[str]:
    h, w = result.size_hw
    count = len(result.detections)
    plural = "s" if count != 1 else ""
    lines = [f"{shown(result.image)}: {w}x{h}, {count} detection{plural} -> {shown(result.output)}"]
    for det in result.detections:
        box = ", ".join(f"{v:.1f}" for v in det.box_xyxy)
        lines.append(f"  {names[det.class_id]:<15} {det.score:.3f}  [{box}]")
    return lines


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    with Batch(args) as batch:
        detect(args, batch)
    return batch.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``candle-yolo-v8``."""
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
