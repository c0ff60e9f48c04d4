"""``candle-yolo-v8 --task classify``: a YOLOv8-cls model's top-k classes per image, printed as
``candle-resnet`` prints them (``label: 12.34%``), and with ``--save-txt`` ultralytics' classify
labels (``<out>/labels/<stem>.txt``: the top 5 as ``probability name`` lines, ``%.2f``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from candle_nn import model_dtype
from candle_nn.cli import printable
import mlx.core as mx
import numpy as np

from candle_nn_models.yolo_v8_classify import YoloV8Cls, preprocess
from candle_nn_models.scripts.common import check_finite, load_rgb, shown
from candle_nn_models.scripts.image_loop import Batch
from candle_nn_models.scripts.outputs import OutputFolder

LABEL_TOP = 5  # ultralytics' save_txt writes the top 5


def top_classes(probs: np.ndarray, k: int) -> list[tuple[int, float]]:
    """``(class index, probability)`` of the ``k`` best classes, best first (ties: lower index)."""
    return [(int(i), float(probs[i])) for i in np.argsort(-probs, kind="stable")[:k]]


def classify_images(args: argparse.Namespace, batch: Batch, paths: Sequence[Path],
                    model: YoloV8Cls, names: Sequence[str], weights: Path) -> None:
    """Each image: ``preprocess`` at ``--size`` (the file's transform when it crops to that
    size) → probabilities → top ``--top-k`` (``--save-txt``: labels)."""
    output = batch.output = OutputFolder(args.out if args.out is not None
                                         else "runs/classify/predict", args.exist_ok)
    k = min(args.top_k, model.num_classes)
    for image in batch.progress(paths):
        with batch.image(image):
            x = preprocess(load_rgb(image, args.max_pixels), args.size, model.preprocessing)[None]
            probs = np.array(model(mx.array(x).astype(model_dtype(model))).astype(mx.float32))[0]
            check_finite(probs, weights)
            top = top_classes(probs, k)
            if args.save_txt:
                lines = [f"{p:.2f} {printable(names[i])}"
                         for i, p in top_classes(probs, LABEL_TOP)]
                output.save_text("".join(f"{line}\n" for line in lines),
                                 f"labels/{output.claim_stem(image)}.txt", image)
            entries = [{"index": i, "label": names[i], "probability": p} for i, p in top]
            batch.done({"image": shown(image), "top_k": entries},
                       [f"{shown(image)}:"] + [f"  {printable(names[i]):24}: {100 * p:.2f}%"
                                               for i, p in top])
