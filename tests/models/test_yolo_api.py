"""The YOLO task API (``from candle_nn_models import yolo``) against its thin client
``candle-yolo-v8``: for each task (YOLOv8 detect and pose from the fixtures, YOLOv8-seg,
YOLOv8-cls and YOLO11 detect from seeded ultralytics models converted here) the CLI's ``--json``
record is ``Result.to_json()`` of the same image and weights, and its saved drawing is
``Result.plot()``; every kind of source gives the same Result; bad input is one CandleNNError."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image

import candle_nn as cn
from conftest import FIXTURES
from candle_nn_models import yolo
from candle_nn_models.scripts.yolo_v8 import main as yolo_cli

BIKE = FIXTURES / "images" / "bike.jpg"
SIZE = 160  # the CLI's --size, the API's imgsz: small and quick


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> dict:
    """task -> weights file: the fixtures' detector and pose model; seeded ultralytics models
    (YOLOv8-seg, YOLOv8-cls with 10 classes, YOLO11n) converted as the converter does."""
    from helpers.ultralytics_models import convert_and_save, seeded
    from helpers.yolo11_reference import bike, seeded_model

    tmp = tmp_path_factory.mktemp("yolo_api")
    return {"detect": FIXTURES / "yolov8n" / "weights.safetensors",
            "pose": FIXTURES / "yolov8n_pose" / "weights.safetensors",
            "segment": convert_and_save(seeded("SegmentationModel", "yolov8n-seg.yaml", nc=80),
                                        tmp / "seg.safetensors"),
            "classify": convert_and_save(seeded("ClassificationModel", "yolov8n-cls.yaml", nc=10),
                                         tmp / "cls.safetensors"),
            "yolo11": convert_and_save(seeded_model("yolo11n.yaml", bike(128, SIZE), nc=80),
                                       tmp / "yolo11n.safetensors")}


def _cli_record(capsys, *argv) -> dict:
    """``candle-yolo-v8 --json`` on one image: its one record."""
    capsys.readouterr()
    code = yolo_cli([str(a) for a in argv] + ["--json", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 0, err
    (record,) = json.loads(out)["images"]
    return record


# (task, CLI options, the same as predict keywords)
CASES = [
    ("detect", [], {}),
    ("detect", ["--conf", 0.5, "--iou", 0.5, "--max-det", 7, "--classes", 0, 22, "--half"],
     {"conf": 0.5, "iou": 0.5, "max_det": 7, "classes": [0, 22], "half": True}),
    ("detect", ["--agnostic-nms", "--square"], {"agnostic_nms": True, "square": True}),
    ("pose", ["--conf", 0.1], {"conf": 0.1}),
    ("segment", [], {}),
    ("segment", ["--retina-masks"], {"retina_masks": True}),
    ("classify", ["--top-k", 3], {"top_k": 3}),
    ("yolo11", [], {}),
]


@pytest.mark.parametrize("task,flags,keywords", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_the_cli_record_is_the_api_result(weights, task, flags, keywords, capsys, tmp_path):
    record = _cli_record(capsys, "--image", BIKE, "--weights", weights[task], "--size", SIZE,
                         "--out", tmp_path / "run", *flags)
    model = yolo.load(weights[task], "cpu")
    (result,) = model.predict(str(BIKE), imgsz=SIZE, **keywords)
    if task == "classify":
        assert record == result.to_json() and len(record["top_k"]) == 3
        assert result.boxes is None and result.probs.shape == (10,)
        assert record["top_k"][0]["label"] == str(int(np.argmax(result.probs)))  # no names
        return
    assert record == result.to_json(output=record["output"])
    assert record["detections"], "the case must detect something to compare"
    # the arrays behind the record, in original-image pixels
    boxes = result.boxes
    assert boxes.xyxy.shape == (len(record["detections"]), 4) and result.orig_shape == (556, 800)
    np.testing.assert_allclose(boxes.xyxy, [d["box_xyxy"] for d in record["detections"]],
                               atol=0.005)
    assert boxes.cls.tolist() == [d["class_id"] for d in record["detections"]]
    np.testing.assert_allclose(boxes.conf, [d["score"] for d in record["detections"]], atol=5e-5)
    assert (result.keypoints is not None) == (task == "pose")
    assert (result.masks is not None) == (task == "segment")
    if task == "pose":
        assert result.keypoints.shape == (len(boxes), 17, 3)


@pytest.mark.parametrize("task", ["detect", "pose", "segment"])
def test_plot_is_the_image_the_cli_saves(weights, task, capsys, tmp_path):
    png = tmp_path / "bike.png"  # a PNG input gives a PNG drawing: lossless, comparable exactly
    Image.open(BIKE).save(png)
    options = ["--line-width", 3, "--hide-conf"] if task == "detect" else []
    record = _cli_record(capsys, "--image", png, "--weights", weights[task], "--size", SIZE,
                         "--out", tmp_path / "run", *options)
    saved = np.asarray(Image.open(record["output"]).convert("RGB"))
    (result,) = yolo.load(weights[task], "cpu").predict(png, imgsz=SIZE)
    drawing = (result.plot(line_width=3, conf=False) if task == "detect" else result.plot())
    assert drawing.dtype == np.uint8 and drawing.shape == (556, 800, 3)
    assert np.array_equal(drawing, saved)
    assert not np.array_equal(drawing, result.orig_img)  # something was drawn


def test_every_kind_of_source_gives_the_same_result(weights, tmp_path):
    model = yolo.load(weights["detect"], cn.Device.cpu())
    rgb = np.asarray(Image.open(BIKE).convert("RGB"))
    folder = tmp_path / "photos"
    folder.mkdir()
    shutil.copy(BIKE, folder / "a.jpg")
    shutil.copy(BIKE, folder / "b.jpg")
    (folder / "notes.txt").write_text("not an image")
    (want,) = model.predict(BIKE, imgsz=SIZE)
    record = want.to_json()
    sources = {"str": [str(BIKE)], "folder": [folder], "glob": [str(folder / "*.jpg")],
               "list": [[BIKE, rgb, Image.open(BIKE)]], "pil": [Image.open(BIKE)],
               "array": [rgb], "mx": [mx.array(rgb)], "mx batch": [mx.array(np.stack([rgb] * 2))]}
    counts = {"folder": 2, "glob": 2, "list": 3, "mx batch": 2}
    for kind, (source,) in sources.items():
        results = model.predict(source, imgsz=SIZE)
        assert len(results) == counts.get(kind, 1), kind
        for r in results:
            assert r.to_json()["detections"] == record["detections"], kind
            assert np.array_equal(r.orig_img, rgb), kind
    assert [r.path for r in model.predict(folder, imgsz=SIZE)] == [folder / "a.jpg",
                                                                 folder / "b.jpg"]
    assert model.predict(rgb, imgsz=SIZE)[0].to_json()["image"] is None


@pytest.mark.parametrize("task", ["detect", "pose", "segment"])
def test_batch_and_letterboxed_predict_give_predicts_results(weights, task):
    """``predict_batch`` (``--video``'s frames) and ``predict_letterboxed`` (candle-nn-batch's
    pre-letterboxed inputs) give ``predict``'s records; a letterboxed result has the original's
    size but no image to plot; a classifier is refused."""
    from candle_nn_models.yolo.predict import model_input

    model = yolo.load(weights[task], "cpu")
    rgb = np.asarray(Image.open(BIKE).convert("RGB"))
    (want,) = model.predict(rgb, imgsz=SIZE, conf=0.1)
    assert want.detections, "the threshold must leave detections to compare"
    (frame,) = model.predict_batch([rgb], imgsz=SIZE, conf=0.1)
    assert frame.to_json() == want.to_json()
    assert np.array_equal(frame.plot(), want.plot())
    (boxed,) = model.predict_letterboxed([model_input(rgb, SIZE)], imgsz=SIZE, conf=0.1)
    assert boxed.to_json() == want.to_json() and boxed.orig_shape == (556, 800)
    _one_error(boxed.plot, "letterboxed input")
    assert len(model.predict_batch([rgb, rgb[:, ::-1].copy()], imgsz=SIZE)) == 2
    classifier = yolo.load(weights["classify"], "cpu")
    _one_error(lambda: classifier.predict_batch([rgb]), "a classifier", "classify with predict")
    _one_error(lambda: model.predict_batch([]), "no images")
    _one_error(lambda: model.predict_batch([rgb[..., 0]]), "(H, W, 3)")


def test_the_cli_options_are_the_predict_options():
    """candle-yolo-v8's predict options are PredictOptions' fields: its defaults are theirs, and
    each field's flag parses into that field."""
    import dataclasses

    from candle_nn_models.scripts.yolo_v8 import build_parser
    from candle_nn_models.scripts.yolo_v8_predict import predict_options

    parser = build_parser()
    defaults = yolo.PredictOptions()
    assert predict_options(parser.parse_args(["--image", "x.jpg"])) == dataclasses.asdict(defaults)
    args = parser.parse_args(["--image", "x.jpg", "--conf", "0.5", "--size", "320", "--classes",
                              "1", "2", "--half", "--top-k", "2", "--max-pixels", "1000"])
    assert yolo.PredictOptions(**predict_options(args)) == dataclasses.replace(
        defaults, conf=0.5, imgsz=320, classes=[1, 2], half=True, top_k=2, max_pixels=1000)


def test_the_default_iou_is_ultralytics_07(weights, monkeypatch):
    from candle_nn_models.yolo import predict as pipeline

    assert yolo.PredictOptions().iou == 0.7
    seen = []
    real = pipeline.postprocess

    def spy(*args, **kwargs):
        seen.append(kwargs["iou"])
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "postprocess", spy)
    yolo.load(weights["detect"], "cpu").predict(BIKE, imgsz=SIZE)
    assert seen == [0.7]


def _one_error(call, *fragments):
    with pytest.raises(cn.CandleNNError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return info.value


def test_bad_input_is_one_candle_nn_error(weights, tmp_path):
    model = yolo.load(weights["detect"], "cpu")
    predict = model.predict
    missing = tmp_path / "missing.jpg"
    assert isinstance(_one_error(lambda: predict(missing), str(missing), "image not found"),
                      cn.ImageError)
    _one_error(lambda: predict(str(tmp_path / "*.png")), "no image file matches")
    _one_error(lambda: predict(tmp_path), "no image files")
    _one_error(lambda: predict(3), "cannot read a int", "PIL image")
    _one_error(lambda: predict(np.zeros((4, 4, 3), np.float32)), "uint8")
    _one_error(lambda: predict(np.zeros((4, 4), np.uint8)), "(H, W, 3)")
    _one_error(lambda: predict([]), "empty list")
    _one_error(lambda: predict([[BIKE]]), "list of lists")
    _one_error(lambda: predict(BIKE, conf=2), "conf=2", "[0, 1]")
    _one_error(lambda: predict(BIKE, imgsz=100), "imgsz=100", "multiple of 32")
    _one_error(lambda: predict(BIKE, max_det=0), "max_det=0")
    _one_error(lambda: predict(BIKE, classes=["person"]), "class ids")
    _one_error(lambda: predict(BIKE, classes=[80]), "the model has 80 classes")
    _one_error(lambda: predict(BIKE, confidence=0.5), "unknown predict option 'confidence'",
               "conf")
    _one_error(lambda: yolo.load(tmp_path / "none.safetensors", "cpu"), "not found")
    _one_error(lambda: yolo.load(weights["detect"], "cpu", task="pose"),
               "does not match --task pose")
    _one_error(lambda: yolo.load(None, "cpu", task="segment"), "candle-nn-weights convert")
    _one_error(lambda: yolo.load(weights["classify"], "cpu").predict(BIKE)[0].plot(),
               "result.probs")
