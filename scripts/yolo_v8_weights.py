"""The YOLO model every YOLOv8 command loads (predict, ``val``, ``candle-nn-batch``, the app):
:func:`candle_nn_models.yolo.load` with the command line's ``--weights``, ``--task``,
``--variant`` and ``--half``; without ``--weights``, candle's published checkpoint for the task
and variant (:func:`candle_nn_models.yolo.load.published_weights`)."""

from __future__ import annotations

from pathlib import Path

from candle_nn import Device

from candle_nn_models import yolo
from candle_nn_models.yolo.load import published_weights
from candle_nn_models.yolo_checkpoint import YoloModel
from candle_nn_models.yolo_v8 import YoloV8Spec
from candle_nn_models.weights.registry import resolve_weights


def load_yolo(weights: "str | Path | None", task: str | None, variant: str | None,
              device: Device, dtype: str = "float32") -> yolo.YOLO:
    """The model in ``weights`` (default: the published checkpoint of ``task``/``variant``),
    checked against the requested ``task``/``variant``, in ``dtype``."""
    if weights is None:  # the published file, which must then be exactly what was asked for
        registry, task, variant = published_weights(task, variant)
        weights = resolve_weights(registry, variant)
    return yolo.load(weights, device, task=task, variant=variant, half=dtype == "float16")


def load_detector(weights: "str | Path | None", task: str | None, variant: str | None,
                  device: Device, dtype: str = "float32",
                  ) -> tuple[YoloModel, YoloV8Spec, list[str], Path]:
    """:func:`load_yolo`'s network, spec, class names and weights file."""
    model = load_yolo(weights, task, variant, device, dtype)
    return model.model, model.spec, model.names, model.path
