"""A YOLO model from a weights file as every YOLOv8 command loads it (predict, ``val``,
``candle-nn-batch``): the published YOLOv8 checkpoint by default, else YOLOv8 or YOLO11 as the
file holds, the file's task and variant checked against the ones asked for, class names from
the file's metadata."""

from __future__ import annotations

from pathlib import Path

from candle_nn import CandleNNError, Device, VarBuilder, WeightsFileError

from candle_nn_models.coco import coco_class_names
from candle_nn_models.yolo_checkpoint import YoloModel, infer_spec, load_model
from candle_nn_models.yolo_v8 import YoloV8Spec
from candle_nn_models.weights.metadata import WeightsMetadata
from candle_nn_models.weights.registry import resolve_weights

# task -> the registry's model name (its published files, or the error saying there are none)
REGISTRY_MODELS = {"detect": "yolo_v8", "pose": "yolo_v8_pose", "segment": "yolo_v8_seg",
                   "classify": "yolo_v8_cls"}


def load_detector(weights: "str | Path | None", task: str | None, variant: str | None,
                  device: Device, dtype: str = "float32",
                  ) -> tuple[YoloModel, YoloV8Spec, list[str], Path]:
    """The model in ``weights`` (default: the published checkpoint of ``task``/``variant``),
    checked against the requested ``task``/``variant``, in ``dtype``; plus its class names and
    file."""
    if weights is None:  # the published checkpoint must then be exactly what was asked for
        task, variant = task or "detect", variant or "n"
        if task in ("segment", "classify"):
            suffix = "-seg" if task == "segment" else "-cls"
            raise WeightsFileError(
                f"candle publishes no YOLOv8{suffix} weights: convert ultralytics' checkpoint "
                f"(candle-nn-weights convert --from ultralytics yolov8{variant}{suffix}.pt "
                f"yolov8{variant}{suffix}.safetensors) and pass it with --weights")
    path = resolve_weights(REGISTRY_MODELS[task or "detect"], variant or "n", weights)
    vb = VarBuilder.from_safetensors(path, device=device, dtype=dtype)
    try:
        spec = infer_spec(vb, name=str(path))
    except WeightsFileError as exc:
        raise WeightsFileError(f"{exc}. Pass YOLOv8 or YOLO11 weights with --weights") from None
    wrong = [f"--{flag} {want}" for flag, want, have in
             (("task", task, spec.task), ("variant", variant, spec.variant))
             if want is not None and want != have]
    if wrong:
        raise CandleNNError(f"{path} holds {spec}, which does not match {' '.join(wrong)}: "
                            "drop the option to use this file, or pass matching --weights")
    names = WeightsMetadata.from_dict(vb.metadata).names
    if names is None:  # candle's own files carry no names: theirs are COCO's
        names = list(coco_class_names()) if spec.task != "classify" else []
    if len(names) < spec.num_classes:  # e.g. a custom model without names: number the rest
        names = list(names) + [str(i) for i in range(len(names), spec.num_classes)]
    return load_model(vb, spec), spec, names, path
