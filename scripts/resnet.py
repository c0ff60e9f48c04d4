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
import sys
from pathlib import Path
from typing import Sequence

from candle_nn import CandleNNError, Device, VarBuilder
import mlx.core as mx
import numpy as np

from candle_nn_models.classify_transforms import eval_resize
from candle_nn_models.imagenet import CROP, RESIZE, class_names, preprocess
from candle_nn_models.resnet import VARIANTS, ResNet, class_probabilities
from candle_nn_models.scripts.resnet_weights import open_resnet_weights
from candle_nn_models.scripts.image_loop import Batch
from candle_nn.cli import ArgumentParser, printable
from candle_nn_models.scripts.common import (add_device_argument, add_input_arguments, check_finite,
                                             compile_choice, load_rgb, number_arg, parse_device,
                                             run_main, shown)
from candle_nn_models.training_size import training_size
from candle_nn_models.weights.metadata import WeightsMetadata
from candle_nn_models.weights.spec import build_model


def _at_least_one(text: str) -> int:
    value = number_arg(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="candle-resnet",
                            description="Classify images with a ResNet. "
                                        "`candle-resnet train --help`: fine-tune one.")
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
    parser.add_argument("--labels", default=None, metavar="FILE",
                        help="class names, one a line in class-index order (labels.txt of "
                             "`candle-resnet train`); default: the weights' own, else ImageNet's")
    return parser


def load_classifier(weights: str | None, variant: str | None, device: Device,
                    labels: str | None = None) -> tuple[ResNet, list[str], Path]:
    """The ResNet in ``weights`` (default: the published ``variant``), checked against
    ``variant``, its labels (``labels``: a file of them) and the weights file."""
    vb, found, num_classes, path = open_resnet_weights(weights, variant, device)
    if num_classes is None:
        raise CandleNNError(f"{path} holds a headless {found} (no fc layer): it cannot classify")
    names = WeightsMetadata.from_dict(vb.metadata).names
    if labels is not None:
        names = read_labels(labels, num_classes, path)
    elif not names or len(names) != num_classes:
        names = list(class_names()) if num_classes == 1000 else [str(i) for i in range(num_classes)]
    return build_model("resnet", found, vb, num_classes=num_classes), names, path


def read_labels(path: str, num_classes: int, weights: Path) -> list[str]:
    """The class names in ``path`` (one a line, blank lines ignored), ``num_classes`` of them."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CandleNNError(f"cannot read --labels {path}: "
                            f"{getattr(exc, 'strerror', None) or exc}") from None
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if len(names) != num_classes:
        raise CandleNNError(f"--labels {path} has {len(names)} names, but {shown(weights)} "
                            f"classifies into {num_classes} classes; pass the labels.txt written "
                            "with these weights")
    return names


def image_size(model_file: Path) -> tuple[int, int]:
    """``(resize, crop)`` of the evaluation transform: 256/224, or a trained file's own size
    (``candle_nn.imgsz``, bounded: WeightsFileError beyond ``MAX_IMGSZ``)."""
    metadata = VarBuilder.from_safetensors(model_file).metadata
    size = training_size(metadata, shown(model_file))
    return (eval_resize(size), size) if size is not None else (RESIZE, CROP)


def classify(model: ResNet, batch: Batch, paths: Sequence[Path], names: Sequence[str],
             top_k: int, batch_size: int, weights: Path) -> None:
    """Top-k labels of each image, ``batch_size`` images a forward; unreadable images skipped."""
    pending: list[tuple[Path, np.ndarray]] = []
    resize, crop = image_size(weights)
    for n, path in enumerate(batch.progress(paths), 1):
        with batch.image(path):
            pending.append((path, preprocess(load_rgb(path, batch.args.max_pixels), resize, crop)))
        if len(pending) == batch_size or (n == len(paths) and pending):
            tops = top_k_probabilities(model, np.stack([x for _, x in pending]), top_k)
            check_finite(np.array([p for top in tops for _, p in top]), weights)  # NaN logits
            for (image, _), top in zip(pending, tops):
                entries = [{"index": i, "label": names[i], "probability": prob} for i, prob in top]
                batch.done({"image": shown(image), "top_k": entries},  # candle's `label: 12.34%`
                           [f"{shown(image)}:"] + [f"  {printable(names[i]):24}: "
                                                  f"{100 * prob:.2f}%"
                                                  for i, prob in top])
            pending.clear()


def top_k_probabilities(model: ResNet, batch: np.ndarray,
                        top_k: int) -> list[list[tuple[int, float]]]:
    """Top-k ``(class index, probability)`` per image of a preprocessed ``(N, S, S, 3)``
    batch, best first (ties keep the lower index)."""
    with model.on_device():
        probs = np.array(class_probabilities(model(mx.array(batch))))
    return [[(int(i), float(row[i])) for i in np.argsort(-row, kind="stable")[:top_k]]
            for row in probs]


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        from candle_nn_models.scripts import resnet_train

        return resnet_train.main(argv[1:])
    args = build_parser().parse_args(argv)
    with Batch(args) as batch:
        paths = batch.start()
        if paths:
            device = parse_device(args.device, args.verbose)
            model, names, weights = load_classifier(args.weights, args.variant, device,
                                                     args.labels)
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
