"""The ResNet task API (``from candle_nn_models import resnet``) against its thin client
``candle-resnet``: the CLI's ``--json`` record of each image is ``Classification.to_json()`` of
the same image, weights and options (the fixtures' ResNet-18; a seeded 4-class file that records
its labels and training size); every kind of source gives the same result; bad input is one
CandleNNError."""

from __future__ import annotations

import dataclasses
import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image

import candle_nn as cn
from conftest import FIXTURES
from candle_nn_models import resnet
from candle_nn_models.imagenet import class_names, preprocess
from candle_nn_models.scripts.resnet import build_parser, predict_options
from candle_nn_models.scripts.resnet import main as resnet_cli
from candle_nn_models.weights.metadata import WeightsMetadata

BIKE = FIXTURES / "images" / "bike.jpg"
WEIGHTS = FIXTURES / "resnet18" / "weights.safetensors"
LABELS = ["cat", "dog", "fish", "bird"]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A seeded 4-class ResNet-18 whose file records its labels and a 64-pixel training size."""
    path = tmp_path_factory.mktemp("resnet_api") / "small.safetensors"
    varmap = cn.VarMap()
    resnet.ResNet.load(cn.VarBuilder.from_varmap(varmap, seed=3, device="cpu"), "resnet18", 4)
    varmap.save(path, {**WeightsMetadata(names=LABELS).to_dict(), "candle_nn.imgsz": "64"})
    return path


def _cli_records(capsys, *argv) -> list[dict]:
    capsys.readouterr()
    code = resnet_cli([str(a) for a in argv] + ["--json", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)["images"]


def _pictures(tmp_path) -> list:
    """The bike, a crop of it as PNG and a mirrored one: three different images."""
    rgb = np.asarray(Image.open(BIKE).convert("RGB"))
    paths = [BIKE, tmp_path / "crop.png", tmp_path / "mirror.png"]
    Image.fromarray(rgb[100:400, 200:700]).save(paths[1])
    Image.fromarray(rgb[:, ::-1]).save(paths[2])
    return paths


@pytest.mark.parametrize("flags,keywords", [([], {}),
                                            (["--top-k", 3, "--batch-size", 2],
                                             {"top_k": 3, "batch_size": 2})])
def test_the_cli_records_are_the_api_results(flags, keywords, capsys, tmp_path):
    paths = _pictures(tmp_path)
    records = _cli_records(capsys, "--image", *paths, "--weights", WEIGHTS, *flags)
    results = resnet.load(WEIGHTS, "cpu").predict([str(p) for p in paths], **keywords)
    assert records == [r.to_json() for r in results]
    k = keywords.get("top_k", 5)
    assert [len(r["top_k"]) for r in records] == [k] * 3
    first = results[0]
    assert first.path == BIKE and first.orig_shape == (556, 800) and len(paths) == 3
    assert first.probs.shape == (1000,) and first.probs.dtype == np.float32
    assert first.top_k == [(e["label"], e["probability"]) for e in records[0]["top_k"]]
    assert first.top_k[0][0] in class_names()
    assert records[1]["top_k"] != records[2]["top_k"]  # the images really differ


def test_labels_and_size_come_from_the_file(small, capsys, tmp_path):
    """A file's own labels and training size (resize 64*256/224, crop 64) on both sides; the
    probabilities are a float64 softmax of the network's logits on that crop."""
    (record,) = _cli_records(capsys, "--image", BIKE, "--weights", small)
    model = resnet.load(small, "cpu")
    assert (model.names, model.resize, model.crop) == (LABELS, 73, 64)
    (result,) = model.predict(BIKE)
    assert record == result.to_json() and len(record["top_k"]) == 4
    assert {e["label"] for e in record["top_k"]} == set(LABELS)
    rgb = np.asarray(Image.open(BIKE).convert("RGB"))
    logits = np.array(model.model(mx.array(preprocess(rgb, 73, 64)[None])), np.float64)[0]
    want = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    np.testing.assert_allclose(result.probs, want, rtol=1e-5, atol=1e-7)
    # --labels / labels= replace the file's
    names = tmp_path / "labels.txt"
    names.write_text("w\nx\n\ny\nz\n")
    (record,) = _cli_records(capsys, "--image", BIKE, "--weights", small, "--labels", names)
    (result,) = resnet.load(small, "cpu", labels=names).predict(BIKE)
    assert record == result.to_json() and {e["label"] for e in record["top_k"]} == set("wxyz")


def test_every_kind_of_source_gives_the_same_result(tmp_path):
    model = resnet.load(WEIGHTS, cn.Device.cpu())
    rgb = np.asarray(Image.open(BIKE).convert("RGB"))
    folder = tmp_path / "photos"
    folder.mkdir()
    shutil.copy(BIKE, folder / "a.jpg")
    shutil.copy(BIKE, folder / "b.jpg")
    (folder / "notes.txt").write_text("not an image")
    (want,) = model.predict(BIKE)
    sources = {"str": str(BIKE), "folder": folder, "glob": str(folder / "*.jpg"),
               "list": [BIKE, rgb, Image.open(BIKE)], "pil": Image.open(BIKE), "array": rgb,
               "mx": mx.array(rgb), "mx batch": mx.array(np.stack([rgb] * 2))}
    counts = {"folder": 2, "glob": 2, "list": 3, "mx batch": 2}
    for kind, source in sources.items():
        for batch_size in (1, 8):
            results = model.predict(source, batch_size=batch_size)
            assert len(results) == counts.get(kind, 1), kind
            for r in results:
                assert r.to_json()["top_k"] == want.to_json()["top_k"], (kind, batch_size)
                assert r.orig_shape == (556, 800), kind
    assert [r.path for r in model.predict(folder)] == [folder / "a.jpg", folder / "b.jpg"]
    assert model.predict(rgb)[0].to_json()["image"] is None


def test_the_cli_options_are_the_predict_options():
    parser = build_parser()
    defaults = resnet.PredictOptions()
    assert predict_options(parser.parse_args(["--image", "x.jpg"])) == dataclasses.asdict(defaults)
    args = parser.parse_args(["--image", "x.jpg", "--top-k", "2", "--batch-size", "3",
                              "--max-pixels", "1000"])
    assert resnet.PredictOptions(**predict_options(args)) == dataclasses.replace(
        defaults, top_k=2, batch_size=3, max_pixels=1000)


def _one_error(call, *fragments):
    with pytest.raises(cn.CandleNNError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return info.value


def test_bad_input_is_one_candle_nn_error(small, tmp_path):
    predict = resnet.load(WEIGHTS, "cpu").predict
    missing = tmp_path / "missing.jpg"
    assert isinstance(_one_error(lambda: predict(missing), str(missing), "image not found"),
                      cn.ImageError)
    _one_error(lambda: predict(str(tmp_path / "*.png")), "no image file matches")
    _one_error(lambda: predict(tmp_path), "no image files")
    _one_error(lambda: predict(3), "cannot read a int", "PIL image")
    _one_error(lambda: predict(np.zeros((4, 4, 3), np.float32)), "uint8")
    _one_error(lambda: predict([]), "empty list")
    _one_error(lambda: predict(BIKE, top_k=0), "top_k=0", ">= 1")
    _one_error(lambda: predict(BIKE, batch_size=2.5), "batch_size=2.5")
    _one_error(lambda: predict(BIKE, topk=3), "unknown predict option 'topk'", "top_k")
    _one_error(lambda: resnet.load(tmp_path / "none.safetensors", "cpu"), "not found")
    _one_error(lambda: resnet.load(WEIGHTS, "cpu", variant="resnet50"),
               "holds resnet18 weights, not resnet50")
    (tmp_path / "three.txt").write_text("a\nb\nc\n")
    _one_error(lambda: resnet.load(small, "cpu", labels=tmp_path / "three.txt"), "has 3 names",
               "4 classes")
    _one_error(lambda: resnet.load(WEIGHTS, "tpu"), "tpu")
