"""YOLOv8 detection and pose against the ultralytics reference fixtures, plus structure tests.

Each fixture model runs once per device at 640×640 (module-scoped cache, fed ``input.image``);
every parity test reads its output from there. Other sizes are only built, from the weights
module's recording VarBuilder (lazy zeros: nothing is computed), and checked against ultralytics'
published parameter counts.
"""

from __future__ import annotations

import math

import candle_nn as cn
import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_matches, load_fixture, nchw_to_nhwc, nhwc_to_nchw

from candle_nn_models.yolo_v8 import (MULTIPLES, YoloV8, YoloV8Pose, YoloV8Spec, infer_spec,
                                      load_model, num_anchors)
from candle_nn_models.weights.spec import expected_tensors

FIXTURES = ("yolov8n", "yolov8n_pose")
OUTPUTS = ("backbone_p3", "backbone_p4", "backbone_p5", "neck_p3", "neck_p4", "neck_p5", "pred")
# ultralytics' yolov8.yaml: "YOLOv8n summary: 225 layers, 3157200 parameters, …" (80 classes,
# BatchNorm weight and bias counted, running statistics not).
ULTRALYTICS_PARAMETERS = {"n": 3157200, "s": 11166560, "m": 25902640, "l": 43691520, "x": 68229648}


def _vb(name: str, device: cn.Device) -> cn.VarBuilder:
    _, _, folder = load_fixture(name)
    return cn.VarBuilder.from_safetensors(folder / "weights.safetensors", device=device)


@pytest.fixture(scope="module")
def fixture_outputs():
    """``(name, device) -> (intermediates as NumPy NCHW, io, meta)``, each computed once."""
    cache: dict = {}

    def get(name: str, device: cn.Device):
        key = (name, str(device))
        if key not in cache:
            io, meta, _ = load_fixture(name)
            model = load_model(_vb(name, device))
            out = model.intermediates(mx.array(nchw_to_nhwc(io["input.image"])))
            mx.eval(out)
            got = {k: np.array(v) if k == "pred" else nhwc_to_nchw(np.array(v))
                   for k, v in out.items()}
            cache[key] = (got, io, meta)
        return cache[key]

    return get


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("name", FIXTURES)
def test_matches_reference(fixture_outputs, device, name, output) -> None:
    got, io, meta = fixture_outputs(name, device)
    err = assert_matches(meta, output, got[output], io[f"output.{output}"])
    print(f"{name} {output} on {device}: rel err {err:.2e}")


@pytest.mark.parametrize("name, spec", [
    ("yolov8n", YoloV8Spec("n", "detect", 80)),
    ("yolov8n_pose", YoloV8Spec("n", "pose", 1, 17)),
])
def test_infer_spec_reads_the_fixture_files(name, spec) -> None:
    vb = _vb(name, cn.Device.cpu())
    assert infer_spec(vb) == spec
    assert type(load_model(vb)) is (YoloV8Pose if spec.task == "pose" else YoloV8)


def test_wrong_variant_or_task_names_what_the_file_holds() -> None:
    vb = _vb("yolov8n", cn.Device.cpu())
    with pytest.raises(cn.ShapeMismatchError, match=r"hold YOLOv8n \(80 classes\), not YOLOv8s"):
        YoloV8.load(vb, "s")
    with pytest.raises(cn.ShapeMismatchError, match="not YOLOv8n \\(20 classes\\)"):
        YoloV8.load(vb, "n", num_classes=20)
    with pytest.raises(cn.ShapeMismatchError, match="not YOLOv8n-pose"):
        YoloV8Pose.load(vb, "n")


def test_not_a_yolo_checkpoint() -> None:
    vb = cn.VarBuilder.from_tensors({"fc.weight": np.zeros((3, 4), np.float32)}, device="cpu")
    with pytest.raises(cn.WeightsFileError, match="not a YOLOv8 checkpoint"):
        infer_spec(vb)


def test_pose_weights_load_as_a_detector() -> None:
    """The pose checkpoint's detection head is complete: as a detector it gives the pose model's
    first 4 + nc channels."""
    vb = _vb("yolov8n_pose", cn.Device.cpu())
    x = mx.random.uniform(shape=(1, 96, 128, 3), key=mx.random.key(1))
    pose = YoloV8Pose.load(vb, "n")(x)
    det = YoloV8.load(vb, "n", num_classes=1)(x)
    assert det.shape == (1, 5, num_anchors(96, 128)) and pose.shape == (1, 56, det.shape[2])
    np.testing.assert_array_equal(np.array(det), np.array(pose[:, :5]))


@pytest.fixture(scope="module")
def detector() -> YoloV8:
    return load_model(_vb("yolov8n", cn.Device.cpu()))


def test_rectangular_input(detector) -> None:
    x = mx.random.uniform(shape=(1, 384, 640, 3), key=mx.random.key(0))
    out = detector.intermediates(x)
    anchors = 384 // 8 * 640 // 8 + 384 // 16 * 640 // 16 + 384 // 32 * 640 // 32
    assert num_anchors(384, 640) == anchors == 5040
    assert out["pred"].shape == (1, 84, anchors)
    assert out["neck_p3"].shape == (1, 48, 80, 64) and out["neck_p5"].shape == (1, 12, 20, 256)
    pred = np.array(out["pred"])[0]
    assert np.isfinite(pred).all()
    # Each box centre lies within 7.5 cells of its anchor (DFL distances are 0..15 cells per
    # side), so the anchors must be laid out row-major per map, stride 8, 16, 32, x before y.
    centres, strides = [], []
    for s in (8, 16, 32):
        ys, xs = np.mgrid[0:384 // s, 0:640 // s]
        centres.append((np.stack([xs, ys], -1).reshape(-1, 2) + 0.5) * s)
        strides.append(np.full(xs.size, s))
    centres, strides = np.concatenate(centres), np.concatenate(strides)
    assert (np.abs(pred[:2].T - centres) <= 7.5 * strides[:, None] + 1e-3).all()
    assert (pred[2:4] >= 0).all() and (pred[2:4] <= 30 * strides + 1e-3).all()
    assert ((pred[4:] >= 0) & (pred[4:] <= 1)).all()


def test_input_must_be_nhwc_multiple_of_32(detector) -> None:
    with pytest.raises(cn.ShapeMismatchError, match="multiples of 32"):
        detector(mx.zeros((1, 100, 128, 3)))
    with pytest.raises(cn.ShapeMismatchError, match="NHWC"):
        detector(mx.zeros((1, 3, 64, 64)))


def test_other_class_count_from_a_varmap(tmp_path) -> None:
    varmap = cn.VarMap()
    model = YoloV8.load(cn.VarBuilder.from_varmap(varmap, device="cpu", seed=3), "n", num_classes=3)
    x = mx.random.uniform(shape=(2, 64, 96, 3), key=mx.random.key(2))
    pred = np.array(model(x))
    assert pred.shape == (2, 4 + 3, num_anchors(64, 96)) == (2, 7, 126)
    assert np.isfinite(pred).all()
    varmap.save(tmp_path / "three.safetensors")
    vb = cn.VarBuilder.from_safetensors(tmp_path / "three.safetensors", device="cpu")
    assert infer_spec(vb) == YoloV8Spec("n", "detect", 3)
    np.testing.assert_allclose(np.array(load_model(vb)(x)), pred, rtol=1e-5, atol=1e-4)


def _build(variant: str, task: str = "detect", **counts: int) -> dict[str, tuple[int, ...]]:
    """``name -> shape`` of every tensor a model asks for (recorded by loading it from free,
    never-evaluated zeros)."""
    return expected_tensors("yolo_v8_pose" if task == "pose" else "yolo_v8", variant, **counts)


def _parameters(shapes: dict[str, tuple[int, ...]]) -> int:
    return sum(math.prod(s) for k, s in shapes.items() if "running_" not in k)


@pytest.mark.parametrize("name, task", [("yolov8n", "detect"), ("yolov8n_pose", "pose")])
def test_names_and_shapes_are_the_fixture_files(name, task) -> None:
    vb = _vb(name, cn.Device.cpu())
    assert _build("n", task) == {k: vb.shape(k) for k in vb.names()}


@pytest.mark.parametrize("variant", list(MULTIPLES))
def test_every_size_matches_ultralytics_parameter_count(variant) -> None:
    shapes = _build(variant)
    assert _parameters(shapes) == ULTRALYTICS_PARAMETERS[variant]
    width = {"n": 16, "s": 32, "m": 48, "l": 64, "x": 80}[variant]
    assert shapes["net.b1.0.conv.weight"] == (width, 3, 3, 3)
    c2f_depth = sum(1 for k in shapes
                    if k.startswith("net.b2.2.bottleneck.") and k.endswith("cv1.conv.weight"))
    assert c2f_depth == {"n": 2, "s": 2, "m": 4, "l": 6, "x": 6}[variant]
    assert shapes["head.dfl.conv.weight"] == (1, 16, 1, 1)


@pytest.mark.parametrize("variant", list(MULTIPLES))
def test_every_pose_size_builds(variant) -> None:
    shapes = _build(variant, "pose", num_keypoints=17)
    filters = MULTIPLES[variant].filters()
    c4 = max(filters[0] // 4, 51)
    for i, f in enumerate(filters):
        assert shapes[f"head.cv4.{i}.0.conv.weight"] == (c4, f, 3, 3)
        assert shapes[f"head.cv4.{i}.2.weight"] == (51, c4, 1, 1)
    assert shapes["head.cv3.0.2.weight"][0] == 1
    detect = _build(variant, num_classes=1)
    assert {k: v for k, v in shapes.items() if not k.startswith("head.cv4.")} == detect
