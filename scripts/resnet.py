"""``candle-resnet``: classify images with a ResNet (ImageNet labels), like candle's example.

    candle-resnet --image bike.jpg [--image DIR ...] [--variant resnet18..resnet152]
                  [--weights FILE] [--device cpu|gpu] [--top-k 5] [--batch-size 8] [--json]

Without ``--weights`` the default is candle's published ``resnet{depth}.safetensors`` (variant
``resnet18`` unless ``--variant`` says otherwise). With ``--weights`` the variant and class count
are read from the file, and a ``--variant`` that disagrees is an error. Labels come from the file's
``candle_nn.names`` metadata when present, else the 1000 ImageNet classes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from candle_nn import CandleNNError, Device, VarBuilder, softmax  # before mlx: BLAS choice
import mlx.core as mx  # noqa: I001
import numpy as np
from tqdm import tqdm

from models.imagenet import class_names, preprocess
from models.resnet import VARIANTS, ResNet, infer_variant
from scripts.common import (add_device_argument, collect_images, load_rgb, parse_device,
                            run_main)
from scripts.common import compile_choice
from weights.metadata import WeightsMetadata
from weights.registry import resolve_weights


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="candle-resnet",
                                     description="Classify images with a ResNet.")
    parser.add_argument("--image", action="append", required=True, metavar="PATH",
                        help="an image file or a folder of images (repeatable)")
    parser.add_argument("--variant", choices=tuple(VARIANTS), default=None,
                        help="ResNet depth; default: what --weights holds, else resnet18")
    parser.add_argument("--weights", default=None, metavar="FILE",
                        help="ResNet safetensors in candle's layout (default: candle's published "
                             "resnet{depth}.safetensors from the Hugging Face hub)")
    add_device_argument(parser)
    parser.add_argument("--top-k", type=int, default=5, help="labels printed per image (default 5)")
    parser.add_argument("--batch-size", type=int, default=8, help="images per forward (default 8)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    return parser


def load_classifier(weights: str | None, variant: str | None,
                    device: Device) -> tuple[ResNet, list[str]]:
    """The ResNet in ``weights`` (default: the published ``variant``), checked against
    ``variant``, and its labels."""
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
    return ResNet.load(vb, found, num_classes), names


def classify(model: ResNet, images: Sequence[Path], top_k: int,
             batch_size: int) -> list[list[tuple[int, float]]]:
    """Top-k ``(class index, probability)`` per image, in order, ``batch_size`` images a forward."""
    results: list[list[tuple[int, float]]] = []
    with tqdm(total=len(images), unit="img", file=sys.stderr,
              disable=True if len(images) < 2 else None) as bar:
        for start in range(0, len(images), batch_size):
            chunk = images[start:start + batch_size]
            results.extend(top_k_probabilities(
                model, np.stack([preprocess(load_rgb(p)) for p in chunk]), top_k))
            bar.update(len(chunk))
    return results


def top_k_probabilities(model: ResNet, batch: np.ndarray,
                        top_k: int) -> list[list[tuple[int, float]]]:
    """Top-k ``(class index, probability)`` per image of a preprocessed ``(N, 224, 224, 3)``
    batch, best first (ties keep the lower index)."""
    with model.on_device():
        probs = np.array(softmax(model(mx.array(batch)), axis=-1))
    return [[(int(i), float(row[i])) for i in np.argsort(-row, kind="stable")[:top_k]]
            for row in probs]


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.top_k < 1 or args.batch_size < 1:
        raise CandleNNError("--top-k and --batch-size must be at least 1")
    images = collect_images(args.image)
    model, names = load_classifier(args.weights, args.variant, parse_device(args.device, args.verbose))
    model.set_compiled(compile_choice(args.compile))
    results = classify(model, images, min(args.top_k, len(names)), args.batch_size)
    if args.json:
        print(json.dumps({"model": model.variant, "images": [
            {"image": str(p), "top_k": [{"index": i, "label": names[i], "probability": prob}
                                        for i, prob in top]}
            for p, top in zip(images, results)]}, indent=2))
        return 0
    for path, top in zip(images, results):
        print(f"{path}:")
        for i, prob in top:  # candle's example prints `{label:24}: {percent:.2}%`
            print(f"  {names[i]:24}: {100 * prob:.2f}%")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``candle-resnet``."""
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
