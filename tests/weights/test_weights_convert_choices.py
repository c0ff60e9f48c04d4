"""`convert` takes the weights the source tool would load, and names what it refuses: timm's EMA
weights, a head wrapped in a Sequential, 2-value keypoints, and ultralytics state_dicts of other
tasks (OBB, end-to-end YOLO26) or of a fused model."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch  # the `test` extra
from safetensors.numpy import load_file

from conftest import load_fixture, one_error_line
from helpers.weights_fakes import (
    candle_to_ultralytics, random_candle_tensors, save_ultralytics, ultralytics_checkpoint,
)
from candle_nn_models.weights.cli import main
from candle_nn_models.weights.spec import expected_tensors


def _torch(tensors) -> dict:
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}


@pytest.fixture(scope="module")
def resnet18_pair():
    """Two ResNet-18 weight sets (10 classes): the model's own and its EMA."""
    shapes = expected_tensors("resnet", "resnet18", num_classes=10)
    return random_candle_tensors(shapes, seed=1), random_candle_tensors(shapes, seed=2)


def _convert(tmp_path, kind, payload, *extra):
    src, out = tmp_path / "ckpt.pth", tmp_path / "out.safetensors"
    torch.save(payload, src)
    return main(["convert", "--from", kind, str(src), str(out), *extra]), out


def test_timm_takes_the_ema_weights_as_timm_does_and_says_so(tmp_path, capsys, resnet18_pair):
    own, ema = resnet18_pair
    payload = {"epoch": 9, "state_dict": _torch(own), "state_dict_ema": _torch(ema)}
    rc, out = _convert(tmp_path, "timm", payload)
    assert rc == 0
    np.testing.assert_array_equal(load_file(out)["fc.weight"], ema["fc.weight"])
    assert "converted the EMA weights 'state_dict_ema' (what timm loads by default)" in \
        capsys.readouterr().out
    # torchvision's training scripts save "model" and "model_ema"; users load "model"
    rc, out = _convert(tmp_path, "torchvision", {"model": _torch(own), "model_ema": _torch(ema)})
    assert rc == 0
    np.testing.assert_array_equal(load_file(out)["fc.weight"], own["fc.weight"])
    assert "converted 'model'; the file also holds 'model_ema' (EMA weights: --from timm" in \
        capsys.readouterr().out


def test_a_head_inside_a_sequential_is_found_or_refused(tmp_path, capsys, resnet18_pair):
    own, _ = resnet18_pair
    wrapped = {("fc.1" + k[2:] if k.startswith("fc.") else k): v for k, v in own.items()}
    rc, out = _convert(tmp_path, "torchvision", _torch(wrapped))
    assert rc == 0
    converted = load_file(out)
    np.testing.assert_array_equal(converted["fc.weight"], own["fc.weight"])
    assert "fc.1" not in " ".join(converted) and "became fc.*" in capsys.readouterr().out
    mlp = {**wrapped, "fc.3.weight": np.zeros((10, 10), np.float32)}
    rc, _ = _convert(tmp_path, "torchvision", _torch(mlp))
    assert rc == 1
    assert "head fc is a Sequential with weights in 2 layers (fc.1, fc.3)" in \
        one_error_line(capsys)


@pytest.fixture(scope="module")
def name_map():
    with open(os.path.join(load_fixture("yolov8n")[2], "meta.json")) as fh:
        return json.load(fh)["name_map"]


def _ultra(name_map, model="yolo_v8", **counts):
    candle = random_candle_tensors(expected_tensors(model, "n", **counts), seed=5)
    return candle_to_ultralytics(candle, name_map)


def test_two_value_keypoints_are_refused_not_read_as_visibility(tmp_path, capsys, name_map):
    # 3 keypoints of (x, y): 6 channels, which would read as 2 keypoints with visibility
    ultra = _ultra(name_map, "yolo_v8_pose", num_keypoints=2, num_classes=1)
    rc, _ = _convert(tmp_path, "ultralytics", _torch(ultra))
    assert rc == 1
    assert "6 keypoint channels and no kpt_shape" in one_error_line(capsys)
    rc, _ = _convert(tmp_path, "ultralytics", {"kpt_shape": [3, 2], "model": _torch(ultra)})
    assert rc == 1 and "keypoints of shape (3, 2)" in one_error_line(capsys)
    src, out = tmp_path / "pose.pt", tmp_path / "pose.safetensors"

    def factory(f):
        ckpt = ultralytics_checkpoint(ultra, pose=True, names={0: "p"}, factory=f)
        ckpt["ema"]._modules["model"]._modules["22"].kpt_shape = [3, 2]
        return ckpt

    save_ultralytics(src, factory)
    assert main(["convert", "--from", "ultralytics", str(src), str(out)]) == 1
    assert "kpt_shape [K, 3]" in one_error_line(capsys)


def test_ultralytics_state_dicts_of_other_tasks_or_fused_are_named(tmp_path, capsys, name_map):
    ultra = _ultra(name_map, num_classes=3)
    obb = {**ultra, **{f"model.22.cv4.{i}.2.weight": np.zeros((1, 16, 1, 1), np.float32)
                       for i in range(3)}}
    end2end = {**ultra, **{f"model.22.one2one_cv2.{i}.2.weight": np.zeros((64, 16, 1, 1),
                                                                          np.float32)
                           for i in range(3)}}
    fused = {}
    for k, v in ultra.items():
        if ".bn." in k:
            continue
        fused[k] = v
        if k.endswith(".conv.weight") and k.replace(".conv.weight", ".bn.weight") in ultra:
            fused[k.replace(".weight", ".bias")] = np.zeros(v.shape[0], np.float32)
    for sd, fragment in ((obb, "an ultralytics OBB model"),
                         (end2end, "an ultralytics end-to-end model"),
                         (fused, "a fused ultralytics model")):
        rc, _ = _convert(tmp_path, "ultralytics", {"model": _torch(sd)})
        assert rc == 1
        assert fragment in one_error_line(capsys)
    rc, _ = _convert(tmp_path, "ultralytics", _torch(ultra))
    assert rc == 0


def test_tensors_the_model_would_not_read_are_refused_not_kept(tmp_path, capsys, resnet18_pair):
    """A converted file must load: tensors ResNet.load would refuse are not written."""
    own, _ = resnet18_pair
    rc, out = _convert(tmp_path, "torchvision", _torch({**own, "aux.fc.weight": np.zeros((2, 2))}))
    assert rc == 1 and not out.exists()
    assert "1 tensor it does not read (aux.fc.weight)" in one_error_line(capsys)
