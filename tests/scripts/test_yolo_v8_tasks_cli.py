"""End to end for YOLOv8-seg and YOLOv8-cls: a checkpoint saved the way ultralytics saves it (a
stripped ``best.pt``: ``torch.save`` of a dict whose ``model`` is the half-precision model, here
built from the YAML with seeded weights), converted by ``candle-nn-weights convert``, run through
``candle-yolo-v8`` (task read from the file), gives ultralytics' own predictor's boxes, masks
(IoU >= 0.999), segment labels, and classifier probabilities. Plus the task errors."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from conftest import FIXTURES, error_line

from helpers.ultralytics_models import seeded

SIZE = 160
BIKE = FIXTURES / "images" / "bike.jpg"


def _save_like_ultralytics(model, path, task):
    """What ultralytics' strip_optimizer leaves in best.pt."""
    torch.save({"date": "2026-01-01", "version": "8.4.190", "epoch": -1,
                "model": copy.deepcopy(model).half(), "ema": None, "updates": None,
                "optimizer": None, "train_args": {"task": task, "imgsz": SIZE},
                "train_metrics": {}}, path)
    model.half().float()  # the reference runs on the same (half-rounded) weights


def _convert(src, out, capsys):
    from candle_nn_models.weights.cli import main as weights

    assert weights(["convert", "--from", "ultralytics", str(src), str(out)]) == 0
    capsys.readouterr()
    return out


def _predict(monkeypatch, checkpoint, **kwargs):
    """ultralytics' own predictor on bike.jpg. Its warm-up only imports torchvision (to switch
    its NMS to torchvision's, absent here: see helpers/ultralytics_reference.py) and runs
    nothing on the CPU, so it is skipped."""
    from ultralytics import YOLO
    from ultralytics.nn.autobackend import AutoBackend

    monkeypatch.setattr(AutoBackend, "warmup", lambda self, *a, **k: None)
    return YOLO(str(checkpoint), task="segment").predict(str(BIKE), imgsz=SIZE, verbose=False,
                                                         save=False, **kwargs)[0]


def _cli(capsys, *argv):
    from candle_nn_models.scripts.yolo_v8 import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def segment(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seg")
    ref = seeded("SegmentationModel", "yolov8n-seg.yaml", nc=80)
    _save_like_ultralytics(ref, tmp / "best.pt", "segment")
    return ref, tmp


def test_segment_cli_gives_ultralytics_predictions(segment, capsys, tmp_path, monkeypatch):
    from pycocotools import mask as mask_utils
    from ultralytics.utils import ops

    ref, tmp = segment
    weights = _convert(tmp / "best.pt", tmp_path / "seg.safetensors", capsys)
    out = tmp_path / "run"
    code, stdout, _ = _cli(capsys, "--image", BIKE, "--weights", weights, "--size", SIZE,
                           "--out", out, "--json", "--save-txt")
    assert code == 0
    doc = json.loads(stdout)
    assert doc["task"] == "segment" and doc["model"] == "YOLOv8n-seg (80 classes, 32 masks)"
    got = doc["images"][0]["detections"]
    want = _predict(monkeypatch, tmp / "best.pt", conf=0.25, iou=0.7)
    assert 3 <= len(got) == len(want.boxes)
    np.testing.assert_allclose([d["box_xyxy"] for d in got], want.boxes.xyxy.numpy(), atol=0.5)
    assert [d["class_id"] for d in got] == want.boxes.cls.int().tolist()
    np.testing.assert_allclose([d["score"] for d in got], want.boxes.conf.numpy(), atol=2e-4)
    ref_masks = ops.scale_masks(want.masks.data[None].float(), want.orig_shape)[0] > 0.5
    for det, ref_mask in zip(got, ref_masks.numpy()):
        mask = mask_utils.decode({"size": det["segmentation"]["size"],
                                  "counts": det["segmentation"]["counts"].encode()}).astype(bool)
        assert mask.shape == want.orig_shape
        iou = (mask & ref_mask).sum() / max((mask | ref_mask).sum(), 1)
        assert iou >= 0.999, iou
    assert (out / "bike_segment.jpg").is_file()
    ours = (out / "labels" / "bike.txt").read_text().splitlines()
    want.save_txt(tmp_path / "want.txt")
    theirs = (tmp_path / "want.txt").read_text().splitlines()
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        a, b = np.array(a.split(), float), np.array(b.split(), float)
        assert a[0] == b[0] and len(a) == len(b)
        np.testing.assert_allclose(a, b, atol=2e-3)  # polygons of masks within IoU 0.999


def test_segment_retina_masks_and_crops(segment, capsys, tmp_path, monkeypatch):
    from pycocotools import mask as mask_utils

    _, tmp = segment
    weights = _convert(tmp / "best.pt", tmp_path / "seg.safetensors", capsys)
    code, stdout, _ = _cli(capsys, "--image", BIKE, "--weights", weights, "--size", SIZE,
                           "--out", tmp_path / "run", "--json", "--retina-masks", "--save-crop")
    assert code == 0
    got = json.loads(stdout)["images"][0]["detections"]
    want = _predict(monkeypatch, tmp / "best.pt", retina_masks=True)
    assert len(got) == len(want.masks.data)
    for det, ref_mask in zip(got, want.masks.data.numpy().astype(bool)):
        mask = mask_utils.decode({"size": det["segmentation"]["size"],
                                  "counts": det["segmentation"]["counts"].encode()}).astype(bool)
        iou = (mask & ref_mask).sum() / max((mask | ref_mask).sum(), 1)
        assert iou >= 0.999, iou
    assert len(list((tmp_path / "run" / "crops").rglob("*.jpg"))) == len(got)


def test_classify_cli_gives_ultralytics_probabilities(capsys, tmp_path):
    from PIL import Image

    from candle_nn_models.yolo_v8_classify import preprocess

    ref = seeded("ClassificationModel", "yolov8n-cls.yaml", nc=10)
    ref.names = {i: f"class{i}" for i in range(10)}
    _save_like_ultralytics(ref, tmp_path / "best.pt", "classify")
    weights = _convert(tmp_path / "best.pt", tmp_path / "cls.safetensors", capsys)
    code, stdout, _ = _cli(capsys, "--image", BIKE, "--weights", weights, "--json",
                           "--top-k", 3, "--save-txt", "--out", tmp_path / "run")
    assert code == 0
    doc = json.loads(stdout)
    assert doc["task"] == "classify" and doc["model"] == "YOLOv8n-cls (10 classes)"
    top = doc["images"][0]["top_k"]
    rgb = np.asarray(Image.open(BIKE).convert("RGB"))
    with torch.no_grad():
        probs = ref(torch.from_numpy(preprocess(rgb, SIZE)[None]).permute(0, 3, 1, 2))[0][0].numpy()
    order = np.argsort(-probs, kind="stable")
    assert [t["index"] for t in top] == order[:3].tolist()
    assert [t["label"] for t in top] == [f"class{i}" for i in order[:3]]
    np.testing.assert_allclose([t["probability"] for t in top], probs[order[:3]], atol=1e-4)
    labels = (tmp_path / "run" / "labels" / "bike.txt").read_text().splitlines()
    assert labels == [f"{probs[i]:.2f} class{i}" for i in order[:5]]
    code, stdout, _ = _cli(capsys, "--image", BIKE, "--weights", weights)
    assert code == 0 and stdout.splitlines()[1].split(":")[0].strip() == f"class{order[0]}"


def test_task_errors_are_one_line(capsys, tmp_path, segment):
    _, tmp = segment
    weights = _convert(tmp / "best.pt", tmp_path / "seg.safetensors", capsys)
    code, out, err = _cli(capsys, "--image", BIKE, "--weights", weights, "--task", "classify",
                          "--out", tmp_path / "a")
    assert code == 1 and "does not match --task classify" in error_line(err)
    assert not (tmp_path / "a").exists()
    code, out, err = _cli(capsys, "--image", BIKE, "--task", "segment", "--out", tmp_path / "b")
    assert code == 1 and "candle-nn-weights convert --from ultralytics" in error_line(err)
    assert not (tmp_path / "b").exists()
    with pytest.raises(SystemExit) as exit_:
        _cli(capsys, "--video", BIKE, "--task", "classify")
    assert exit_.value.code == 2
