"""``convert --from ultralytics`` on checkpoints of ultralytics' own models (built from their YAML
with seeded weights, saved as ultralytics saves them): YOLOv8 segment and classify convert, with
their class names and the metadata the CLIs read; the tasks and versions still unsupported (OBB,
YOLO26, YOLOv5u) are one error line naming what the file is, and no output file."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import error_line

from helpers.ultralytics_models import seeded


def _save(model, path, task):
    torch.save({"model": copy.deepcopy(model).half(), "ema": None,
                "train_args": {"task": task}}, path)


def _convert(src, out):
    from candle_nn_models.weights.cli import main

    return main(["convert", "--from", "ultralytics", str(src), str(out)])


@pytest.mark.parametrize("kind, yaml, task, model, label", [
    ("SegmentationModel", "yolov8s-seg.yaml", "segment", "yolo_v8_seg",
     "YOLOv8s-seg (3 classes, 32 masks)"),
    ("ClassificationModel", "yolov8n-cls.yaml", "classify", "yolo_v8_cls",
     "YOLOv8n-cls (3 classes)"),
])
def test_segment_and_classify_checkpoints_convert(tmp_path, capsys, kind, yaml, task, model,
                                                   label):
    import candle_nn as cn

    from candle_nn_models.weights.metadata import read_metadata
    from candle_nn_models.yolo_v8 import infer_spec, load_model

    ref = seeded(kind, yaml, nc=3)
    ref.names = {0: "cat", 1: "dog", 2: "bird"}
    _save(ref, tmp_path / "best.pt", task)
    assert _convert(tmp_path / "best.pt", tmp_path / "out.safetensors") == 0
    assert f"{model} {yaml[6]}" in capsys.readouterr().out
    meta = read_metadata(tmp_path / "out.safetensors")
    assert (meta.model, meta.task, meta.num_classes, meta.names) == (
        model, task, 3, ["cat", "dog", "bird"])
    vb = cn.VarBuilder.from_safetensors(str(tmp_path / "out.safetensors"))
    assert str(infer_spec(vb)) == label
    load_model(vb)


@pytest.mark.parametrize("kind, yaml, task, fragment", [
    ("OBBModel", "yolov8n-obb.yaml", "obb", "OBBModel"),
    ("DetectionModel", "yolo26n.yaml", "detect", "YOLO26 model"),
    ("SegmentationModel", "yolo26n-seg.yaml", "segment", "YOLO26 model"),
    ("ClassificationModel", "yolo26n-cls.yaml", "classify", "YOLO26 classification model"),
    ("DetectionModel", "yolov5nu.yaml", "detect", "YOLOv5u model"),
])
def test_unsupported_tasks_and_versions_are_named(tmp_path, capsys, kind, yaml, task, fragment):
    _save(seeded(kind, yaml), tmp_path / "best.pt", task)
    capsys.readouterr()
    assert _convert(tmp_path / "best.pt", tmp_path / "out.safetensors") == 1
    error_line(capsys.readouterr().err, fragment)
    assert not (tmp_path / "out.safetensors").exists()
