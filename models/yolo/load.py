"""A YOLO model from a weights file, as the task API and every YOLO command load it: the published
YOLOv8 checkpoint by default, else YOLOv8 or YOLO11 as the file holds, the file's task and variant
checked against the ones asked for, class names from the file's metadata."""

from __future__ import annotations

from pathlib import Path

from candle_nn import CandleNNError, Device, VarBuilder, WeightsFileError

from candle_nn_models.coco import coco_class_names
from candle_nn_models.yolo_checkpoint import YoloModel, infer_spec, load_model
from candle_nn_models.yolo_v8 import YoloV8Spec
from candle_nn_models.weights.metadata import WeightsMetadata

__all__ = ["REGISTRY_MODELS", "load_file", "published_weights"]

# task -> the registry's model name (its published files, or the error saying there are none)
REGISTRY_MODELS = {"detect": "yolo_v8", "pose": "yolo_v8_pose", "segment": "yolo_v8_seg",
                   "classify": "yolo_v8_cls"}


def published_weights(task: str | None, variant: str | None) -> tuple[str, str, str]:
    """``(registry model, task, variant)`` of candle's published checkpoint for ``task``
    (default detect) and ``variant`` (default n), which the file must then hold exactly; segment
    and classify have none (an error naming the conversion that makes one)."""
    task, variant = task or "detect", variant or "n"
    if task in ("segment", "classify"):
        suffix = "-seg" if task == "segment" else "-cls"
        raise WeightsFileError(
            f"candle publishes no YOLOv8{suffix} weights: convert ultralytics' checkpoint "
            f"(candle-nn-weights convert --from ultralytics yolov8{variant}{suffix}.pt "
            f"yolov8{variant}{suffix}.safetensors) and pass it with --weights")
    return REGISTRY_MODELS[task], task, variant


def load_file(path: Path, task: str | None, variant: str | None, device: Device,
              dtype: str = "float32") -> tuple[YoloModel, YoloV8Spec, list[str]]:
    """The model in the file ``path``, checked against the requested ``task``/``variant``, in
    ``dtype``; plus its class names (one per class: the file's, else COCO's for candle's own
    detectors, the rest numbered)."""
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
    return load_model(vb, spec), spec, names
