"""Checkpoints as ultralytics' trainer writes them run at ultralytics' defaults: the training
size (``train_args`` / ``model.args`` ``imgsz``) is every entry point's default input size, a
classifier's stored ``model.transforms`` (a torchvision ``Compose``, read without torchvision) is
its preprocessing, ``--size`` applies to every task, and a size a file records is bounded.
References: ultralytics' own predictor (detection), the seeded ultralytics classifier on the
transform computed in the test (:mod:`helpers.torchvision_transforms`)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from conftest import FIXTURES, error_line
from PIL import Image

from helpers.torchvision_transforms import (classify_transforms, reference_transform,
                                            torchvision_registered)
from helpers.ultralytics_models import seeded

BIKE = FIXTURES / "images" / "bike.jpg"
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _save(model, path, task: str, imgsz: int) -> None:
    """ultralytics' best.pt: the half model (with its transforms, for a classifier)."""
    with torchvision_registered():
        torch.save({"model": copy.deepcopy(model).half(), "ema": None,
                    "train_args": {"task": task, "imgsz": imgsz}}, path)
    model.half().float()  # the reference runs on the same (half-rounded) weights


def _convert(src, out, capsys):
    from candle_nn_models.weights.cli import main

    code = main(["convert", "--from", "ultralytics", str(src), str(out)])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    return out


def _cli(capsys, *argv):
    from candle_nn_models.scripts.yolo_v8 import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _probs(ref, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return ref(torch.from_numpy(x[None]).permute(0, 3, 1, 2))[0][0].numpy()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A YOLOv8n-cls trained at 32 px whose trainer stored ImageNet-normalising transforms."""
    tmp = tmp_path_factory.mktemp("cls")
    ref = seeded("ClassificationModel", "yolov8n-cls.yaml", nc=10)
    ref.names = {i: f"class{i}" for i in range(10)}
    ref.transforms = classify_transforms(32, *IMAGENET)
    _save(ref, tmp / "best.pt", "classify", 32)
    return ref, tmp / "best.pt"


def test_classifier_with_stored_transforms_runs_them_at_its_training_size(
        classifier, capsys, tmp_path):
    from candle_nn_models.weights.metadata import read_metadata

    ref, src = classifier
    weights = _convert(src, tmp_path / "cls.safetensors", capsys)
    extra = read_metadata(weights).extra
    assert extra["candle_nn.imgsz"] == "32"
    recorded = json.loads(extra["candle_nn.preprocess"])
    assert (recorded["resize"], recorded["crop"]) == (32, 32)
    np.testing.assert_allclose([recorded["mean"], recorded["std"]], IMAGENET, rtol=1e-6)
    code, stdout, err = _cli(capsys, "--image", BIKE, "--weights", weights, "--json",
                             "--top-k", 10)
    assert code == 0, err
    got = {t["index"]: t["probability"] for t in json.loads(stdout)["images"][0]["top_k"]}
    rgb = np.asarray(Image.open(BIKE).convert("RGB"))
    want = _probs(ref, reference_transform(rgb, 32, *IMAGENET))
    np.testing.assert_allclose([got[i] for i in range(10)], want, atol=1e-4)


def test_size_applies_to_classification(classifier, capsys, tmp_path):
    """``--size 64`` is not the stored transforms' size: ultralytics then uses
    classify_transforms(64) (no normalisation), and so does the CLI."""
    ref, src = classifier
    weights = _convert(src, tmp_path / "cls.safetensors", capsys)
    code, stdout, err = _cli(capsys, "--image", BIKE, "--weights", weights, "--json",
                             "--top-k", 10, "--size", 64)
    assert code == 0, err
    got = {t["index"]: t["probability"] for t in json.loads(stdout)["images"][0]["top_k"]}
    rgb = np.asarray(Image.open(BIKE).convert("RGB"))
    want = _probs(ref, reference_transform(rgb, 64))
    np.testing.assert_allclose([got[i] for i in range(10)], want, atol=1e-4)


def test_detector_runs_at_its_training_size_as_ultralytics_predict(capsys, tmp_path,
                                                                    monkeypatch):
    ref = seeded("DetectionModel", "yolov8n.yaml", nc=80)
    with torch.no_grad():  # fewer, better separated scores than seeded's: NMS not tie-bound
        for branch in ref.model[-1].cv3:
            branch[-1].bias.uniform_(-5.0, -1.0)
    from ultralytics import YOLO
    from ultralytics.nn.autobackend import AutoBackend

    _save(ref, tmp_path / "best.pt", "detect", 160)
    weights = _convert(tmp_path / "best.pt", tmp_path / "det.safetensors", capsys)
    code, stdout, err = _cli(capsys, "--image", BIKE, "--weights", weights, "--json",
                             "--out", tmp_path / "run")
    assert code == 0, err
    got = json.loads(stdout)["images"][0]["detections"]
    monkeypatch.setattr(AutoBackend, "warmup", lambda self, *a, **k: None)
    want = YOLO(str(tmp_path / "best.pt"), task="detect").predict(  # imgsz: the checkpoint's
        str(BIKE), verbose=False, save=False)[0]
    at_640 = YOLO(str(tmp_path / "best.pt"), task="detect").predict(
        str(BIKE), verbose=False, save=False, imgsz=640)[0]
    assert len(at_640.boxes) != len(want.boxes)  # the size decides the result
    # The seeded head gives many boxes of equal scores, among which each NMS keeps its own
    # representatives: the count, the classes and the scores are compared, not the boxes.
    assert 3 <= len(got) == len(want.boxes)
    assert sorted(d["class_id"] for d in got) == sorted(want.boxes.cls.int().tolist())
    np.testing.assert_allclose(sorted(d["score"] for d in got),
                               np.sort(want.boxes.conf.numpy()), atol=3e-4)  # JSON: 4 places


def test_a_training_size_out_of_bounds_is_one_error(capsys, tmp_path):
    from safetensors.numpy import load_file, save_file

    from candle_nn_models.weights.metadata import read_metadata

    ref = seeded("ClassificationModel", "yolov8n-cls.yaml", nc=3)
    _save(ref, tmp_path / "best.pt", "classify", 224)
    good = _convert(tmp_path / "best.pt", tmp_path / "cls.safetensors", capsys)
    meta = read_metadata(good).to_dict()
    for value in ("100000", "3000", "-5", "many"):
        bad = tmp_path / f"bad{value}.safetensors"
        save_file(load_file(good), str(bad), metadata={**meta, "candle_nn.imgsz": value})
        code, out, err = _cli(capsys, "--image", BIKE, "--weights", bad, "--out", tmp_path / "r")
        assert code == 1 and "candle_nn.imgsz" in error_line(err) and "32..2048" in err
        assert not (tmp_path / "r").exists()


def test_resnet_batch_and_cli_use_a_fine_tuned_files_size(tmp_path):
    """candle-nn-batch and ResNet.load (model.imgsz) take a fine-tuned ResNet's training size as
    candle-resnet does."""
    from safetensors.numpy import load_file, save_file

    from candle_nn_models.scripts.ray_models import JobOptions, batch_model, identify
    from candle_nn_models.scripts.resnet import image_size

    src = FIXTURES / "resnet18" / "weights.safetensors"
    path = tmp_path / "tuned.safetensors"
    save_file(load_file(str(src)), str(path), metadata={"candle_nn.imgsz": "96"})
    assert image_size(path) == (109, 96)
    import candle_nn as cn

    from candle_nn_models.resnet import ResNet

    assert ResNet.load(cn.VarBuilder.from_safetensors(str(path)), "resnet18").imgsz == 96
    options = identify(JobOptions(model="resnet", weights=str(path)))[0]
    model = batch_model(options)  # as each actor builds it
    rgb = np.asarray(Image.open(BIKE).convert("RGB"))
    x, _ = model.preprocess(rgb)
    assert options.size == 96 and x.shape == model.input_shape == (96, 96, 3)
    from candle_nn_models.imagenet import preprocess

    np.testing.assert_array_equal(x, preprocess(rgb, 109, 96))
