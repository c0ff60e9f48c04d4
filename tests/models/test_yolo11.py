"""YOLO11 detect and pose against ultralytics' own models (``yolo11{n,m}[-pose].yaml``, seeded
weights, see helpers/yolo11_reference.py) on bike.jpg: raw head outputs, the decoded prediction
and the detections after NMS, within the float32 rule of ``../shared/fixtures/README.md`` (10×
the reference's own float32-vs-float64 error, floored at 1e-4, relative to the largest value).
Every size's tensor names and shapes are ultralytics'. The parity runs on every available device."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch

import candle_nn as cn
from helpers.ultralytics_reference import import_ultralytics
from helpers.yolo11_reference import bike, float32_tolerance, seeded_model
from candle_nn_models.letterbox import Letterbox
from candle_nn_models.weights.convert import convert_ultralytics, save
from candle_nn_models.weights.spec import expected_tensors
from candle_nn_models.yolo11 import SCALES, Yolo11, Yolo11Pose, Yolo11Spec, infer_spec
from candle_nn_models.yolo_checkpoint import load_model
from candle_nn_models.yolo_v8_post import postprocess


def _ours(model: torch.nn.Module, tmp_path, name: str, device: cn.Device) -> cn.VarBuilder:
    """The reference's state_dict as the converter writes it, opened as a VarBuilder on
    ``device``."""
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    path = tmp_path / f"{name}.safetensors"
    save(convert_ultralytics(state, source=name), path)
    return cn.VarBuilder.from_safetensors(str(path), device=device)


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("yaml, size, nc", [("yolo11n.yaml", (128, 160), 80),
                                            ("yolo11m.yaml", (64, 96), 80),
                                            ("yolo11n-pose.yaml", (128, 160), 1)])
def test_matches_ultralytics(tmp_path, device, yaml, size, nc):
    x = bike(*size)
    ref = seeded_model(yaml, x, nc=nc)
    want, tol = float32_tolerance(ref, x)
    model = load_model(_ours(ref, tmp_path, yaml, device))
    pose = "-pose" in yaml
    assert isinstance(model, Yolo11Pose if pose else Yolo11)
    assert model.spec == Yolo11Spec(yaml[6], "pose" if pose else "detect", nc, 17 if pose else 0)
    nhwc = mx.array(x.transpose(0, 2, 3, 1))

    pred = np.asarray(model(nhwc))
    assert _rel(pred, want["pred"]) <= tol

    model.train()  # the raw head outputs (BatchNorm stays folded: no batch statistics)
    raw = model(nhwc)
    model.eval()
    maps, kpts = raw if pose else (raw, None)
    per_anchor = np.concatenate([np.asarray(m).reshape(1, -1, m.shape[-1]) for m in maps], 1)
    assert _rel(per_anchor[..., :64].transpose(0, 2, 1), want["boxes"]) <= tol
    assert _rel(per_anchor[..., 64:].transpose(0, 2, 1), want["scores"]) <= tol
    if pose:
        assert _rel(np.asarray(kpts).transpose(0, 2, 1), want["kpts"]) <= tol

    # detections: ultralytics' NMS on its float64 prediction vs ours, in input pixels (clipped to
    # the image, as ultralytics' scale_boxes / scale_coords do)
    import_ultralytics()
    from ultralytics.utils.nms import non_max_suppression

    ref_dets = non_max_suppression(torch.from_numpy(want["pred"]), 0.25, 0.7, nc=nc)[0].numpy()
    xy_max = np.asarray(size[::-1], np.float64)
    ref_dets[:, :4] = np.clip(ref_dets[:, :4], 0, np.tile(xy_max, 2))
    identity = Letterbox(np.zeros((*size, 3), np.uint8), 1.0, (0, 0), size)
    ours = postprocess(pred, [identity], num_classes=nc, num_keypoints=17 if pose else 0,
                       conf=0.25, iou=0.7)[0]
    assert len(ref_dets) >= 3 and len(ours) == len(ref_dets)
    scale = np.abs(want["pred"]).max()
    for det, row in zip(ours, ref_dets):
        assert det.class_id == int(row[5])
        assert abs(det.score - row[4]) <= tol
        assert np.abs(np.asarray(det.box_xyxy) - row[:4]).max() <= tol * scale
        if pose:
            kpt = row[6:].reshape(-1, 3).copy()
            kpt[:, :2] = np.clip(kpt[:, :2], 0, xy_max)
            assert np.abs(np.asarray(det.keypoints) - kpt).max() <= tol * scale


@pytest.mark.parametrize("variant", list(SCALES))
def test_every_size_reads_ultralytics_tensors(variant):
    """Names and shapes of what our model reads = ultralytics' state_dict (detect; pose for n)."""
    import_ultralytics()
    from ultralytics.nn.tasks import DetectionModel, PoseModel

    tasks = [("yolo11", DetectionModel, "")] + ([("yolo11_pose", PoseModel, "-pose")]
                                                if variant == "n" else [])
    for model, cls, suffix in tasks:
        ref = cls(f"yolo11{variant}{suffix}.yaml", nc=80, verbose=False)
        want = {k: tuple(v.shape) for k, v in ref.state_dict().items()
                if not k.endswith("num_batches_tracked")}
        assert expected_tensors(model, variant, num_classes=80) == want


def test_infer_spec_and_wrong_weights():
    ref = seeded_model("yolo11n.yaml", bike(64, 64), nc=3)
    vb = cn.VarBuilder.from_tensors({k: v.numpy() for k, v in ref.state_dict().items()
                                     if not k.endswith("num_batches_tracked")})
    assert infer_spec(vb) == Yolo11Spec("n", "detect", 3)
    assert str(infer_spec(vb)) == "YOLO11n (3 classes)"
    with pytest.raises(cn.ShapeMismatchError, match="hold YOLO11n .3 classes., not YOLO11s"):
        Yolo11.load(vb, "s", 3)
    with pytest.raises(cn.ShapeMismatchError, match="not YOLO11n-pose"):
        Yolo11Pose.load(vb, "n", 17, 3)
    with pytest.raises(cn.WeightsFileError, match="not a YOLO11 checkpoint"):
        infer_spec(cn.VarBuilder.from_tensors({"net.b1.0.conv.weight": np.zeros((16, 3, 3, 3),
                                                                                np.float32)}))
