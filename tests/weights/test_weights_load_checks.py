"""Nonsense weights are refused at load: integer-typed tensors in a float model, empty heads."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FIXTURES, fixture_dir, one_error_line
from safetensors.numpy import load_file, save_file

import candle_nn as cn
from candle_nn_models.resnet import ResNet
from candle_nn_models.segment_anything import Sam
from candle_nn_models.yolo_v8 import YoloV8, YoloV8Pose
from candle_nn_models.scripts import resnet as resnet_cli
from candle_nn_models.scripts import segment_anything as sam_cli
from candle_nn_models.scripts import yolo_v8 as yolo_cli

BIKE = str(FIXTURES / "images" / "bike.jpg")


def _tensors(fixture: str) -> dict[str, np.ndarray]:
    return load_file(fixture_dir(fixture) / "weights.safetensors")


# (fixture, tensor made integer, library loader, CLI main, extra CLI arguments)
MODELS = {
    "resnet18": ("fc.weight", lambda vb: ResNet.load(vb, "resnet18", 1000), resnet_cli.main, []),
    "yolov8n": ("head.cv3.0.2.weight", lambda vb: YoloV8.load(vb, "n", 80), yolo_cli.main,
                ["--size", "320"]),
    "mobile_sam": ("mask_decoder.iou_token.weight", Sam.load, sam_cli.main,
                   ["--point", "0.5,0.5"]),
}


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.uint8, np.bool_])
def test_integer_weights_are_refused_naming_tensor_and_file(tmp_path, dtype):
    tensors = _tensors("resnet18")
    tensors["fc.weight"] = (tensors["fc.weight"] * 100).astype(dtype)
    path = tmp_path / "quantized.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(cn.CandleNNError) as info:
        ResNet.load(cn.VarBuilder.from_safetensors(path, device="cpu"), "resnet18", 1000)
    name = np.dtype(dtype).name
    assert str(info.value).startswith(
        f"tensor 'fc.weight' in {path} is {name}, not floating point: model weights must be "
        "float32, float16 or bfloat16"), str(info.value)


@pytest.mark.parametrize("fixture", list(MODELS))
def test_every_cli_refuses_integer_weights_with_one_line(tmp_path, capsys, fixture):
    name, _, main, extra = MODELS[fixture]
    tensors = _tensors(fixture)
    tensors[name] = (tensors[name] * 1000).astype(np.int16)
    path = tmp_path / f"{fixture}-int16.safetensors"
    save_file(tensors, str(path))
    out = tmp_path / "out"
    extra = [*extra, "--out", str(out)] if main is not resnet_cli.main else extra
    assert main(["--image", BIKE, "--weights", str(path), *extra]) == 1
    line = one_error_line(capsys)
    assert f"tensor '{name}' in {path} is int16, not floating point" in line, line
    assert not out.exists()


def test_zero_class_heads_are_refused_at_load(tmp_path, capsys):
    resnet = _tensors("resnet18")
    resnet["fc.weight"], resnet["fc.bias"] = np.zeros((0, 512), np.float32), np.zeros(0, np.float32)
    path = tmp_path / "resnet-0.safetensors"
    save_file(resnet, str(path))
    assert resnet_cli.main(["--image", BIKE, "--weights", str(path)]) == 1
    assert one_error_line(capsys) == (
        f"error: {path} has an empty classifier head: fc.weight is (0, 512), 0 classes")
    with pytest.raises(cn.ShapeMismatchError, match="at least 1 class, not 0"):
        ResNet.load(cn.VarBuilder.from_safetensors(path, device="cpu"), "resnet18", 0)

    yolo = _tensors("yolov8n")
    for i in range(3):
        key = f"head.cv3.{i}.2"
        yolo[f"{key}.weight"] = yolo[f"{key}.weight"][:0]
        yolo[f"{key}.bias"] = yolo[f"{key}.bias"][:0]
    path = tmp_path / "yolo-0.safetensors"
    save_file(yolo, str(path))
    assert yolo_cli.main(["--image", BIKE, "--weights", str(path), "--size", "320",
                          "--out", str(tmp_path / "out")]) == 1
    assert one_error_line(capsys).startswith(
        f"error: {path} has an empty detection head: head.cv3.0.2.weight has 0 output channels "
        "(0 classes)")
    assert not (tmp_path / "out").exists()
    vb = cn.VarBuilder.from_safetensors(fixture_dir("yolov8n") / "weights.safetensors",
                                        device="cpu")
    with pytest.raises(cn.ShapeMismatchError, match="0 classes is empty"):
        YoloV8.load(vb, "n", 0)
    with pytest.raises(cn.ShapeMismatchError, match="0 keypoints is empty"):
        YoloV8Pose.load(vb, "n", num_keypoints=0)


@pytest.mark.parametrize("fixture", list(MODELS))
def test_float_weights_of_every_model_still_load(fixture):
    _, load, _, _ = MODELS[fixture]
    vb = cn.VarBuilder.from_safetensors(fixture_dir(fixture) / "weights.safetensors",
                                        device="cpu")
    assert load(vb) is not None
