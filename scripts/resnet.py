"""``candle-resnet``: classify images with a ResNet (ImageNet labels), like candle's example.

    candle-resnet --image bike.jpg [DIR 'photos/*.jpg' - ...] [--recursive] [--strict]
                  [--variant resnet18..resnet152] [--weights FILE] [--device cpu|gpu]
                  [--top-k 5] [--batch-size 8] [--max-pixels N] [--json]

Without ``--weights`` the default is candle's published ``resnet{depth}.safetensors`` (variant
``resnet18`` unless ``--variant`` says otherwise). With ``--weights`` the variant and class count
are read from the file, and a ``--variant`` that disagrees is an error. Labels come from the file's
``candle_nn.names`` metadata when present, else the 1000 ImageNet classes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from candle_nn import CandleNNError, Device, VarBuilder
import mlx.core as mx
import numpy as np

from candle_nn_models.imagenet import class_names, preprocess
from candle_nn_models.resnet import VARIANTS, ResNet, class_probabilities, infer_variant
from candle_nn_models.scripts.image_batch import Batch
from candle_nn_models.scripts.common import (add_device_argument, add_input_arguments, check_finite,
                                             load_rgb, parse_device, run_main, shown)
from candle_nn.cli import ArgumentParser
from candle_nn_models.scripts.common import compile_choice, number_arg
from candle_nn_models.weights.metadata import WeightsMetadata
from candle_nn_models.weights.registry import resolve_weights
from candle_nn_models.weights.spec import build_model


def _at_least_one(text: str) -> int:
    value = number_arg(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="candle-resnet", description="Classify images with a ResNet.")
    add_input_arguments(parser, what="top-k labels")
    parser.add_argument("--variant", choices=tuple(VARIANTS), default=None,
                        help="ResNet depth; default: what --weights holds, else resnet18")
    parser.add_argument("--weights", default=None, metavar="FILE",
                        help="ResNet safetensors in candle's layout (default: candle's published "
                             "resnet{depth}.safetensors from the Hugging Face hub)")
    add_device_argument(parser)
    parser.add_argument("--top-k", type=_at_least_one, default=5,
                        help="labels printed per image (default 5)")
    parser.add_argument("--batch-size", type=_at_least_one, default=8,
                        help="images per forward (default 8)")
    return parser


def load_classifier(weights: str | None, variant: str | None,
                    device: Device) -> tuple[ResNet, list[str], Path]:
    """The ResNet in ``weights`` (default: the published ``variant``), checked against
    ``variant``, its labels and the weights file."""
    path = resolve_weights("resnet", variant or "resnet18", weights)
    vb = VarBuilder.from_safetensors(path, device=device)
    found, num_classes = infer_variant(vb, name=str(path))
    if variant is not None and variant != found:
        raise CandleNNError(f"{path} holds {found} weights, not {variant}: drop --variant to use "
                            f"them, or pass {variant} weights with --weights")
    if num_classes is None:
        raise CandleNNError(f"{path} holds a headless {found} (no fc layer): it cannot classify")
    names = WeightsMetadata.from_dict(vb.metadata).names
    if not names or len(names) != num_classes:
        names = list(class_names()) if num_classes == 1000 else [str(i) for i in range(num_classes)]
    return build_model("resnet", found, vb, num_classes=num_classes), names, path


def classify(model: ResNet, batch: Batch, paths: Sequence[Path], names: Sequence[str],
             top_k: int, batch_size: int, weights: Path) -> None:
    """Top-k labels of each image, ``batch_size`` images a forward; unreadable images skipped."""
    pending: list[tuple[Path, np.ndarray]] = []
    for n, path in enumerate(batch.progress(paths), 1):
        with batch.image(path):
            pending.append((path, preprocess(load_rgb(path, batch.args.max_pixels))))
        if len(pending) == batch_size or (n == len(paths) and pending):
            tops = top_k_probabilities(model, np.stack([x for _, x in pending]), top_k)
            check_finite(np.array([p for top in tops for _, p in top]), weights)  # NaN logits
            for (image, _), top in zip(pending, tops):
                entries = [{"index": i, "label": names[i], "probability": prob} for i, prob in top]
                batch.done({"image": shown(image), "top_k": entries},  # candle's `label: 12.34%`
                           [f"{shown(image)}:"] + [f"  {names[i]:24}: {100 * prob:.2f}%"
                                                  for i, prob in top])
            pending.clear()


def top_k_probabilities(model: ResNet, batch: np.ndarray,
                        top_k: int) -> list[list[tuple[int, float]]]:
    """Top-k ``(class index, probability)`` per image of a preprocessed ``(N, 224, 224, 3)``
    batch, best first (ties keep the lower index)."""
    with model.on_device():
        probs = np.array(class_probabilities(model(mx.array(batch))))
    return [[(int(i), float(row[i])) for i in np.argsort(-row, kind="stable")[:top_k]]
            for row in probs]


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    with Batch(args) as batch:
        paths = batch.start()
        if paths:
            device = parse_device(args.device, args.verbose)
            model, names, weights = load_classifier(args.weights, args.variant, device)
            model.set_compiled(compile_choice(args.compile))
            batch.doc["model"] = model.variant
            classify(model, batch, paths, names, min(args.top_k, len(names)), args.batch_size,
                     weights)
    return batch.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``candle-resnet``."""
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
