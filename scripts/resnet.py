"""``candle-resnet``: classify images with a ResNet (ImageNet labels), like candle's example.

    candle-resnet --image bike.jpg [DIR 'photos/*.jpg' - ...] [--recursive] [--strict]
                  [--variant resnet18..resnet152] [--weights FILE] [--device cpu|gpu]
                  [--top-k 5] [--batch-size 8] [--max-pixels N] [--json] [--labels FILE]
    candle-resnet train --data DIR ...   (fine-tune on your images: scripts/resnet_train.py)

Without ``--weights`` the default is candle's published ``resnet{depth}.safetensors`` (variant
``resnet18`` unless ``--variant`` says otherwise). With ``--weights`` the variant and class count
are read from the file, and a ``--variant`` that disagrees is an error. Labels come from
``--labels`` (one name a line, as ``candle-resnet train`` writes), else the file's
``candle_nn.names`` metadata when present, else the 1000 ImageNet classes. A file that records its
training crop size (``candle_nn.imgsz``) is evaluated at that size (resize imgsz*256/224, crop).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Sequence

from candle_nn import Device, VarBuilder
import numpy as np

from candle_nn_models.resnet import VARIANTS, Classifier, PredictOptions, ResNet, load
from candle_nn_models.resnet.classifier import PreparedImage, eval_size, forward_probs
from candle_nn_models.yolo.result import top_classes
from candle_nn_models.scripts.image_loop import Batch
from candle_nn.cli import ArgumentParser, printable
from candle_nn_models.scripts.common import (add_device_argument, add_input_arguments,
                                             compile_choice, load_rgb, number_arg, parse_device,
                                             run_main, shown)


def _at_least_one(text: str) -> int:
    value = number_arg(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="candle-resnet",
                            description="Classify images with a ResNet. "
                                        "`candle-resnet train --help`: fine-tune one.")
    add_input_arguments(parser, what="top-k labels")  # --max-pixels among them
    parser.add_argument("--variant", choices=tuple(VARIANTS), default=None,
                        help="ResNet depth; default: what --weights holds, else resnet18")
    parser.add_argument("--weights", default=None, metavar="FILE",
                        help="ResNet safetensors in candle's layout (default: candle's published "
                             "resnet{depth}.safetensors from the Hugging Face hub)")
    add_device_argument(parser)
    for f in dataclasses.fields(PredictOptions):  # --top-k, --batch-size
        if f.metadata["cli"]:
            parser.add_argument(f.metadata["flag"], type=_at_least_one, default=f.default,
                                help=f.metadata["help"].format(default=f.default))
    parser.add_argument("--labels", default=None, metavar="FILE",
                        help="class names, one a line in class-index order (labels.txt of "
                             "`candle-resnet train`); default: the weights' own, else ImageNet's")
    return parser


def predict_options(args: argparse.Namespace) -> dict[str, Any]:
    """``Classifier.predict``'s keyword arguments from the parsed command line."""
    return {f.name: getattr(args, f.metadata["flag"].lstrip("-").replace("-", "_"))
            for f in dataclasses.fields(PredictOptions)}


# The pieces candle-nn-app (scripts/app_models.py) and candle-nn-batch (scripts/ray_models.py)
# still import from here, each a thin wrapper over the task API.
def load_classifier(weights: str | None, variant: str | None, device: Device,
                    labels: str | None = None) -> tuple[ResNet, list[str], Path]:
    """``resnet.load``'s network, labels and weights file."""
    model = load(weights, device, variant=variant, labels=labels)
    return model.model, model.names, model.path


def image_size(model_file: Path) -> tuple[int, int]:
    """``(resize, crop)`` of the file's evaluation transform (:func:`eval_size`)."""
    return eval_size(VarBuilder.from_safetensors(model_file), model_file)


def top_k_probabilities(model: ResNet, batch: np.ndarray,
                        top_k: int) -> list[list[tuple[int, float]]]:
    """Top-k ``(class index, probability)`` per image of a prepared ``(N, S, S, 3)`` batch, best
    first (ties keep the lower index)."""
    return [top_classes(row, top_k) for row in forward_probs(model, batch)]


def classify(model: Classifier, batch: Batch, paths: Sequence, options: PredictOptions) -> None:
    """Each image's classes into ``batch``, ``options.batch_size`` images a forward (as
    ``Classifier.predict`` groups them); unreadable images skipped."""
    pending: list[PreparedImage] = []
    for n, path in enumerate(batch.progress(paths), 1):
        with batch.image(path):
            pending.append(model.prepare(load_rgb(path, options.max_pixels), path))
        if len(pending) == options.batch_size or (n == len(paths) and pending):
            for result in model.classify(pending, options.top_k):
                batch.done(result.to_json(),  # candle's `label: 12.34%`
                           [f"{shown(result.path)}:"] + [f"  {printable(label):24}: "
                                                         f"{100 * prob:.2f}%"
                                                         for label, prob in result.top_k])
            pending.clear()


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        from candle_nn_models.scripts import resnet_train

        return resnet_train.main(argv[1:])
    args = build_parser().parse_args(argv)
    options = PredictOptions(**predict_options(args))
    with Batch(args) as batch:
        paths = batch.start()
        if paths:
            device = parse_device(args.device, args.verbose)
            model = load(args.weights, device, variant=args.variant, labels=args.labels)
            model.model.set_compiled(compile_choice(args.compile))
            batch.doc["model"] = model.variant
            classify(model, batch, paths, options)
    return batch.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``candle-resnet``."""
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
