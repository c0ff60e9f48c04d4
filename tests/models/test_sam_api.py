"""The SAM task API (``from candle_nn_models import sam``) against its thin client
``candle-segment-anything``: the CLI's ``--json`` record for a prompt, or ``--everything``, is the
API result's ``to_json()`` for the same image, prompt and weights (the fixtures' MobileSAM), and
the files it saves hold the result's masks; every kind of image source gives the same masks, the
encoder runs once per image; bad input is one CandleNNError."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image

import candle_nn as cn
from conftest import FIXTURES
from candle_nn_models import sam
from candle_nn_models.scripts.segment_anything import main as sam_cli
from candle_nn_models.segment_anything import SamPredictor

BIKE = FIXTURES / "images" / "bike.jpg"
WEIGHTS = FIXTURES / "mobile_sam" / "weights.safetensors"
W, H = 800, 556


@pytest.fixture(scope="module")
def model():
    return sam.load(WEIGHTS, "cpu")


def _cli_record(capsys, *argv) -> dict:
    capsys.readouterr()
    code = sam_cli([str(a) for a in argv] + ["--json", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 0, err
    (record,) = json.loads(out)["images"]
    return record


# (CLI prompt options, the same prompt as predict keywords, in pixels)
CASES = [
    (["--point", "580,240"], {"points": [[580, 240]]}),
    (["--point", "0.72,0.43", "--neg-point", "0.2,0.8", "--box", "100,50,700,500", "--multimask",
      "--threshold", "0.5"],
     {"points": [[0.72 * W, 0.43 * H], [0.2 * W, 0.8 * H]], "labels": [1, 0],
      "box": [100, 50, 700, 500], "multimask": True, "threshold": 0.5}),
    (["--box", "0.1,0.1,0.9,0.9"], {"box": np.array([0.1 * W, 0.1 * H, 0.9 * W, 0.9 * H])}),
]


@pytest.mark.parametrize("flags,keywords", CASES, ids=["point", "points-box-multi", "box"])
def test_the_cli_record_is_the_api_result(model, flags, keywords, capsys, tmp_path):
    record = _cli_record(capsys, "--image", BIKE, "--weights", WEIGHTS, "--out", tmp_path / "run",
                         *flags)
    result = model.predict(str(BIKE), **keywords)
    assert record == result.to_json(files=record["files"])
    assert json.loads(open(record["files"]["json"]).read()) == result.to_json()
    count = 3 if keywords.get("multimask") else 1
    assert result.masks.shape == (count, H, W) and result.masks.dtype == bool
    assert result.scores.shape == (count,) and result.orig_shape == (H, W)
    saved = np.asarray(Image.open(record["files"]["mask"])) > 0
    assert np.array_equal(saved, result.masks[result.best])
    np.testing.assert_array_equal(result.masks, result.logits > keywords.get("threshold", 0.0))
    assert result.masks.any(), "the case must segment something to compare"


def test_the_everything_record_is_the_api_result(model, capsys, tmp_path):
    knobs = {"points_per_side": 4, "pred_iou_thresh": 0.0, "stability_score_thresh": 0.0}
    flags = [a for k, v in knobs.items() for a in (f"--{k.replace('_', '-')}", v)]
    record = _cli_record(capsys, "--image", BIKE, "--weights", WEIGHTS, "--out", tmp_path / "run",
                         "--everything", *flags)
    result = model.everything(BIKE, **knobs)
    assert record == result.to_json(files=record["files"])
    assert result.records and result.points == 16
    masks = result.masks
    assert masks.shape == (len(result.records), H, W)
    assert [int(m.sum()) for m in masks] == [r["area"] for r in result.records]
    saved = np.asarray(Image.open(tmp_path / "run" / "bike_masks" / "0.png")) > 0
    assert np.array_equal(saved, masks[0])


def test_every_kind_of_source_gives_the_same_masks_one_encoder_run_each(monkeypatch, tmp_path):
    model = sam.load(WEIGHTS, cn.Device.cpu())
    runs = []
    real = SamPredictor.set_image
    monkeypatch.setattr(SamPredictor, "set_image",
                        lambda self, rgb: runs.append(1) or real(self, rgb))
    rgb = np.asarray(Image.open(BIKE).convert("RGB"))
    prompt = {"points": [[580, 240]]}
    want = model.predict(BIKE, **prompt).to_json()
    for source in (str(BIKE), Image.open(BIKE), rgb, mx.array(rgb), model.image(BIKE)):
        got = model.predict(source, **prompt).to_json()
        assert got["masks"] == want["masks"], type(source)
    assert model.predict(rgb, **prompt).to_json()["image"] is None
    runs.clear()
    image = model.image(BIKE)  # read once, prompted many times: one encoder run
    for points in ([[580, 240]], [[100, 100]], [[580, 240]]):
        model.predict(image, points=points)
    model.predict(image, box=[100, 50, 700, 500])
    assert runs == [1]
    model.predict(rgb, **prompt)
    model.predict(rgb, **prompt)
    assert runs == [1, 1]
    changed = rgb.copy()
    model.predict(changed, **prompt)
    changed[:100] = 0  # the same array with other pixels is encoded anew
    model.predict(changed, **prompt)
    assert runs == [1, 1, 1, 1]
    # an embedding file stands in for the encoder
    path = model.save_embedding(image, tmp_path / "bike.sam.safetensors")
    assert len(runs) == 5
    other = sam.load(WEIGHTS, "cpu")
    got = other.predict(BIKE, embedding=path, **prompt).to_json()
    assert got["masks"] == want["masks"] and len(runs) == 5


def _one_error(call, *fragments):
    with pytest.raises(cn.CandleNNError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return info.value


def test_bad_input_is_one_candle_nn_error(model, tmp_path):
    predict = model.predict
    point = {"points": [[580, 240]]}
    missing = tmp_path / "missing.jpg"
    assert isinstance(_one_error(lambda: predict(missing, **point), "image not found"),
                      cn.ImageError)
    assert isinstance(_one_error(lambda: predict(np.zeros((1, 3000, 3), np.uint8), **point),
                                 "too elongated"), cn.ImageError)
    _one_error(lambda: predict([BIKE, BIKE], **point), "one image a call")
    _one_error(lambda: predict(np.zeros((4, 4, 3), np.float32), **point), "uint8")
    for bad, fragments in [({}, ("no prompt given",)),
                           ({"points": [[900, 10]]}, ("outside the 800x556 image",)),
                           ({"points": [[1, 2, 3]]}, ("(N, 2)",)),
                           ({"points": [[1, 2]], "labels": [2]}, ("one label per point",)),
                           ({"points": [[1, 2]], "labels": [1, 0]}, ("one label per point",)),
                           ({"labels": [1]}, ("without points",)),
                           ({"points": [[float("nan"), 2]]}, ("non-finite",)),
                           ({"points": "here"}, ("not numbers",)),
                           ({"box": [700, 50, 100, 500]}, ("x1 < x2",)),
                           ({"box": [1, 2, 3]}, ("x1, y1, x2, y2",)),
                           ({**point, "threshold": float("inf")}, ("threshold=inf",))]:
        error = _one_error(lambda: predict(BIKE, **bad), *fragments)
        assert isinstance(error, sam.PromptError) or "threshold" in bad, bad
    _one_error(lambda: predict(BIKE, embedding=tmp_path / "none.safetensors", **point),
               "embedding file not found")
    everything = model.everything
    _one_error(lambda: everything(BIKE, points_per_side=0), "points_per_side=0", ">= 1")
    _one_error(lambda: everything(BIKE, box_nms_thresh="high"), "box_nms_thresh='high'")
    _one_error(lambda: everything(BIKE, points=16), "unknown everything option 'points'",
               "points_per_side")
    _one_error(lambda: sam.load(tmp_path / "none.safetensors", "cpu"), "not found")
    _one_error(lambda: sam.load(WEIGHTS, "cpu", variant="vit_b"))
