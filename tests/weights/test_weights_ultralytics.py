"""ultralytics YOLOv8 .pt → candle safetensors: names, class names, forward parity, refusals."""

from __future__ import annotations

import json
import os
import pickle

import mlx.core as mx
import numpy as np
import pytest
import torch  # the `test` extra
from safetensors.numpy import load_file, save_file

import candle_nn as cn
from conftest import load_fixture, one_error_line
from helpers.weights_fakes import (
    candle_to_ultralytics, random_candle_tensors, save_ultralytics, ultralytics_checkpoint,
)
from candle_nn_models.weights.cli import main
from candle_nn_models.weights.metadata import read_metadata
from candle_nn_models.weights.spec import expected_tensors


COCO3 = {0: "cat", 1: "dog", 2: "bird"}


def _fixture_tensors(name: str) -> tuple[dict[str, np.ndarray], dict]:
    _, meta, folder = load_fixture(name)
    return load_file(folder / "weights.safetensors"), meta


def _convert(tmp_path, ckpt_factory, *extra: str) -> tuple[int, str]:
    src, out = tmp_path / "best.pt", tmp_path / "best.safetensors"
    save_ultralytics(src, ckpt_factory)
    return main(["convert", "--from", "ultralytics", str(src), str(out), *extra]), out


@pytest.mark.parametrize("fixture, pose", [("yolov8n", False), ("yolov8n_pose", True)])
def test_fixture_weights_round_trip_through_an_ultralytics_checkpoint(tmp_path, fixture, pose):
    candle, meta = _fixture_tensors(fixture)
    ultra = candle_to_ultralytics(candle, meta["name_map"])
    names = {i: f"class{i}" for i in range(meta["num_classes"])}
    rc, out = _convert(tmp_path, lambda f: ultralytics_checkpoint(ultra, pose=pose, names=names,
                                                                  factory=f))
    assert rc == 0
    converted = load_file(out)
    assert sorted(converted) == sorted(candle)  # num_batches_tracked dropped, nothing else
    for name, value in candle.items():
        assert converted[name].dtype == np.float16
        np.testing.assert_array_equal(converted[name], value, err_msg=name)
    info = read_metadata(out)
    assert (info.model, info.variant, info.task) == (
        ("yolo_v8_pose", "n", "pose") if pose else ("yolo_v8", "n", "detect"))
    assert info.num_classes == meta["num_classes"]
    assert info.num_keypoints == (17 if pose else None)
    assert info.names == list(names.values())
    assert info.source == "ultralytics:best.pt"


@pytest.fixture(scope="module")
def three_class_model():
    """A 3-class YOLOv8n with random weights: candle-named tensors and the ultralytics names."""
    with open(os.path.join(load_fixture("yolov8n")[2], "meta.json")) as fh:
        name_map = json.load(fh)["name_map"]
    candle = random_candle_tensors(expected_tensors("yolo_v8", "n", num_classes=3), seed=3)
    candle = {k: v.astype(np.float16) for k, v in candle.items()}
    return candle, candle_to_ultralytics(candle, name_map)


def test_custom_class_count_converts_and_matches_the_candle_named_forward(tmp_path,
                                                                          three_class_model):
    from candle_nn_models.yolo_v8 import YoloV8

    candle, ultra = three_class_model
    rc, out = _convert(tmp_path, lambda f: ultralytics_checkpoint(ultra, pose=False, names=COCO3,
                                                                  factory=f))
    assert rc == 0
    reference = tmp_path / "candle_named.safetensors"
    save_file(candle, str(reference))
    assert read_metadata(out).names == ["cat", "dog", "bird"]
    x = mx.random.uniform(shape=(1, 64, 96, 3), key=mx.random.key(0))
    outputs = []
    for path in (out, reference):
        model = YoloV8.load(cn.VarBuilder.from_safetensors(path, device="cpu"), "n", 3)
        outputs.append(np.array(model(x)))
    assert outputs[0].shape == (1, 4 + 3, 8 * 12 + 4 * 6 + 2 * 3)  # anchors at strides 8/16/32
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_checks_variant_and_class_count_options(tmp_path, three_class_model, capsys):
    _, ultra = three_class_model
    def factory(f):
        return ultralytics_checkpoint(ultra, pose=False, names=COCO3, factory=f)

    rc, _ = _convert(tmp_path, factory, "--variant", "s")
    assert rc == 1 and "--variant s given, but" in capsys.readouterr().err
    rc, _ = _convert(tmp_path, factory, "--num-classes", "80")
    err = capsys.readouterr().err
    assert rc == 1 and "--num-classes 80" in err and "3 classes" in err
    rc, _ = _convert(tmp_path, factory, "--variant", "n", "--num-classes", "3")
    assert rc == 0


def test_refuses_a_pickle_with_unexpected_objects(tmp_path, capsys):
    class Sneaky:
        def __reduce__(self):
            return (os.getcwd, ())  # harmless if run, but must never be called

    src = tmp_path / "evil.pt"
    torch.save({"model": None, "ema": Sneaky()}, src)
    assert main(["convert", "--from", "ultralytics", str(src),
                 str(tmp_path / "o.safetensors")]) == 1
    assert "refusing to unpickle posix.getcwd" in one_error_line(capsys)
    assert not (tmp_path / "o.safetensors").exists()


def test_refuses_other_ultralytics_tasks_and_architectures(tmp_path, three_class_model, capsys):
    _, ultra = three_class_model
    rc, _ = _convert(tmp_path, lambda f: ultralytics_checkpoint(
        ultra, pose=False, names=COCO3, factory=f, model_class="OBBModel"))
    assert rc == 1 and "OBBModel" in one_error_line(capsys)

    extra = dict(ultra, **{"model.23.cv1.conv.weight": np.zeros((4, 4, 1, 1), np.float32)})
    rc, _ = _convert(tmp_path, lambda f: ultralytics_checkpoint(extra, pose=False, names=COCO3,
                                                                factory=f))
    assert rc == 1 and "layer 23" in one_error_line(capsys)


def test_plain_state_dict_of_an_ultralytics_model_converts(tmp_path, three_class_model):
    candle, ultra = three_class_model
    src, out = tmp_path / "sd.pt", tmp_path / "sd.safetensors"
    torch.save({k: torch.from_numpy(v) for k, v in ultra.items()}, src)
    assert main(["convert", "--from", "ultralytics", str(src), str(out)]) == 0
    converted = load_file(out)
    assert converted.keys() == candle.keys()
    assert read_metadata(out).names is None and read_metadata(out).num_classes == 3


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 truncated zip", pickle.dumps([1, 2, 3])])
def test_corrupt_or_wrong_files_give_one_error(tmp_path, capsys, content):
    src = tmp_path / "bad.pt"
    src.write_bytes(content)
    assert main(["convert", "--from", "ultralytics", str(src),
                 str(tmp_path / "o.safetensors")]) == 1
    one_error_line(capsys)


def test_missing_source_file(tmp_path, capsys):
    assert main(["convert", "--from", "ultralytics", str(tmp_path / "nope.pt"),
                 str(tmp_path / "o.safetensors")]) == 1
    assert "checkpoint not found" in one_error_line(capsys)


def test_names_option_of_the_wrong_count_blames_names_not_the_checkpoint(
        tmp_path, three_class_model, capsys):
    _, ultra = three_class_model
    names = tmp_path / "names.txt"
    names.write_text("cat\ndog\n")
    rc, out = _convert(tmp_path, lambda f: ultralytics_checkpoint(
        ultra, pose=False, names=COCO3, factory=f), "--names", str(names))
    line = one_error_line(capsys)
    assert rc == 1 and not out.exists()
    assert "2 class names from --names for a head of 3 classes" in line
    assert "ultralytics:" not in line
