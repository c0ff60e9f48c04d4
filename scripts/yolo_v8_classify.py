"""``candle-yolo-v8 --task classify``: a YOLOv8-cls model's top-k classes per image, printed as
``candle-resnet`` prints them (``label: 12.34%``), and with ``--save-txt`` ultralytics' classify
labels (``<out>/labels/<stem>.txt``: the top 5 as ``probability name`` lines, ``%.2f``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

from candle_nn.cli import printable

from candle_nn_models.yolo import YOLO
from candle_nn_models.yolo.result import top_classes
from candle_nn_models.scripts.common import shown
from candle_nn_models.scripts.image_loop import Batch
from candle_nn_models.scripts.outputs import OutputFolder

LABEL_TOP = 5  # ultralytics' save_txt writes the top 5


def classify_images(args: argparse.Namespace, batch: Batch, paths: Sequence[Path], model: YOLO,
                    options: dict[str, Any]) -> None:
    """Each image through ``model.predict`` with ``options``: its top ``--top-k`` classes
    (``--save-txt``: labels)."""
    output = batch.output = OutputFolder(args.out if args.out is not None
                                         else "runs/classify/predict", args.exist_ok)
    for image in batch.progress(paths):
        with batch.image(image):
            (result,) = model.predict(image, **options)
            if args.save_txt:
                lines = [f"{p:.2f} {printable(result.names[i])}"
                         for i, p in top_classes(result.probs, LABEL_TOP)]
                output.save_text("".join(f"{line}\n" for line in lines),
                                 f"labels/{output.claim_stem(image)}.txt", image)
            record = result.to_json()
            batch.done(record, [f"{shown(image)}:"] + [
                f"  {printable(e['label']):24}: {100 * e['probability']:.2f}%"
                for e in record["top_k"]])
