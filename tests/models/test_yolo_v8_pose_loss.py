"""YOLOv8-pose's loss against ultralytics' ``v8PoseLoss`` formulas written out in torch (float64).

The boxes, scores and assignment are the ``yolov8n_loss`` fixture's (ultralytics' own assigner
outputs); the keypoint logits and the labelled keypoints are drawn from a seeded generator.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import candle_nn as cn
import mlx.core as mx
import mlx.nn as nn
from candle_nn_models.yolo_v8 import YoloV8Pose
from candle_nn_models.yolo_v8_pose_loss import OKS_SIGMA, PoseLoss
from conftest import fixture_dir, load_fixture
from helpers.yolo_loss_reference import SIZES, anchors_and_strides, feats_of, rel_l2, torch_loss

A = sum(s * s for s in SIZES)


@pytest.fixture(scope="module")
def fixture():
    io, _, _ = load_fixture("yolov8n_loss")
    return io


def _keypoints(io: dict[str, np.ndarray], k: int, dim: int, seed: int = 0):
    """Seeded keypoint logits ``(B, A, K, dim)`` and labels ``(n, K, dim)`` (x, y inside each
    target's box, normalised; a third of them unlabelled)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1.5, (2, A, k, dim)).astype(np.float32)
    targets = io["input.targets"]
    centre, size = targets[:, None, 2:4], targets[:, None, 4:6]
    labels = centre + (rng.random((len(targets), k, 2)) - 0.5) * size
    if dim == 3:
        seen = rng.choice([0.0, 1.0, 2.0], (len(targets), k, 1), p=[1 / 3, 1 / 3, 1 / 3])
        labels = np.concatenate([labels, seen], axis=-1)
    return logits, labels.astype(np.float32)


def _pose_preds(io, logits: np.ndarray) -> tuple[list[mx.array], mx.array]:
    """The pose model's train-mode output: the detection maps and the raw keypoints
    ``(B, A, K * dim)``."""
    return feats_of(io), mx.array(logits.reshape(2, A, -1))


def _torch_keypoint_items(logits: torch.Tensor, labels: np.ndarray, io, sigmas: np.ndarray):
    """ultralytics' v8PoseLoss.calculate_keypoints_loss and KeypointLoss, gains pose 12, kobj 1,
    given the fixture's assignment (fg_mask, target_gt_idx, target_bboxes)."""
    k = logits.shape[2]
    anchors, strides = anchors_and_strides()
    pred = logits.clone()
    pred[..., :2] = logits[..., :2] * 2.0
    pred[..., 0] = pred[..., 0] + anchors[:, [0]] - 0.5
    pred[..., 1] = pred[..., 1] + anchors[:, [1]] - 0.5
    # ultralytics' _batch_keypoints: per image, its rows in order, xy in pixels
    kpts = torch.from_numpy(labels).double()
    if kpts.shape[-1] == 2:
        kpts = torch.cat([kpts, torch.ones_like(kpts[..., :1])], -1)
    image = io["input.targets"][:, 0].astype(int)
    batched = torch.zeros(2, int(np.bincount(image).max()), k, 3, dtype=torch.float64)
    for img in range(2):
        rows = np.flatnonzero(image == img)
        batched[img, :len(rows)] = kpts[rows]
    batched[..., :2] *= 640
    masks = torch.from_numpy(io["output.fg_mask"]) > 0
    gt_idx = torch.from_numpy(io["output.target_gt_idx"]).long()
    target_bboxes = torch.from_numpy(io["output.target_bboxes"]).double() / strides
    gt_kpt = batched[masks.nonzero(as_tuple=True)[0], gt_idx[masks]]
    gt_kpt[..., :2] /= strides.view(1, -1).expand(2, -1)[masks][:, None, None]
    wh = target_bboxes[masks][:, 2:] - target_bboxes[masks][:, :2]
    area = wh.prod(1, keepdim=True)
    pred_kpt = pred[masks]
    kpt_mask = gt_kpt[..., 2] != 0
    d = (pred_kpt[..., 0] - gt_kpt[..., 0]).pow(2) + (pred_kpt[..., 1] - gt_kpt[..., 1]).pow(2)
    factor = kpt_mask.shape[1] / (torch.sum(kpt_mask != 0, dim=1) + 1e-9)
    e = d / ((2 * torch.from_numpy(sigmas).double()).pow(2) * (area + 1e-9) * 2)
    pose = (factor.view(-1, 1) * ((1 - torch.exp(-e)) * kpt_mask)).mean()
    kobj = torch.zeros((), dtype=torch.float64)
    if pred_kpt.shape[-1] == 3:
        kobj = torch.nn.functional.binary_cross_entropy_with_logits(pred_kpt[..., 2],
                                                                    kpt_mask.double())
    return pose * 12.0, kobj * 1.0


@pytest.mark.parametrize("kpt_shape", [(17, 3), (5, 2)])
def test_pose_loss_matches_ultralytics_formula(fixture, kpt_shape) -> None:
    io = fixture
    k, dim = kpt_shape
    logits, labels = _keypoints(io, k, dim)
    sigmas = OKS_SIGMA if kpt_shape == (17, 3) else np.full(k, 1 / k, np.float32)
    ref_logits = torch.from_numpy(logits).double().requires_grad_()
    pose, kobj = _torch_keypoint_items(ref_logits, labels, io, sigmas)
    boxes = torch.from_numpy(io["output.boxes"]).double()
    scores = torch.from_numpy(io["output.scores"]).double()
    _, (box, cls, dfl) = torch_loss(boxes, scores, io)
    ref_items = torch.stack([box, pose, kobj, cls, dfl])
    (ref_items.sum() * 2).backward()

    criterion = PoseLoss(80, kpt_shape)
    preds = _pose_preds(io, logits)
    loss, items = criterion(preds, io["input.targets"], labels)
    np.testing.assert_allclose(np.array(items), ref_items.detach().numpy(), rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(float(loss), 2 * ref_items.sum().item(), rtol=2e-5)

    targets, kpts = mx.array(io["input.targets"]), mx.array(labels)
    grad = mx.grad(lambda k: criterion((preds[0], k), targets, kpts)[0])(preds[1])
    got = np.array(grad).reshape(logits.shape)
    ref = ref_logits.grad.numpy()
    assert rel_l2(got, ref) <= 1e-5, rel_l2(got, ref)


def test_pose_loss_traces_without_host_round_trips(fixture, tmp_path) -> None:
    """As mx.compile needs: fixed shapes, nothing read back (tracing evaluates nothing). Exported
    and replayed rather than compiled: the CPU compile of the detection part is the detection
    test's, and its C++ build costs CI half a minute per new kernel set."""
    io = fixture
    logits, labels = _keypoints(io, 17, 3, seed=1)
    criterion = PoseLoss(80)
    preds = _pose_preds(io, logits)
    targets, kpts = mx.array(io["input.targets"]), mx.array(labels)
    eager = np.array(criterion(preds, targets, kpts)[1])
    path = str(tmp_path / "pose_loss.mlxfn")
    mx.export_function(path, lambda p3, p4, p5, k, t, kp: criterion(([p3, p4, p5], k), t, kp),
                       *preds[0], preds[1], targets, kpts)
    replayed = mx.import_function(path)(*preds[0], preds[1], targets, kpts)
    np.testing.assert_allclose(np.array(replayed[1]), eager, rtol=1e-6)


def test_pose_loss_without_boxes_is_background_only(fixture) -> None:
    io = fixture
    logits, _ = _keypoints(io, 17, 3)
    preds = _pose_preds(io, logits)
    _, items = PoseLoss(80)(preds, np.zeros((0, 6), np.float32), np.zeros((0, 17, 3), np.float32))
    box, pose, kobj, _, dfl = np.array(items)
    assert box == pose == kobj == dfl == 0


def test_pose_loss_names_bad_keypoints(fixture) -> None:
    io = fixture
    logits, labels = _keypoints(io, 17, 3)
    preds = _pose_preds(io, logits)
    with pytest.raises(ValueError, match=r"keypoints of shape \(4, 17, 3\)"):
        PoseLoss(80)(preds, io["input.targets"], labels[:4])
    with pytest.raises(ValueError, match="12 keypoints"):
        PoseLoss(80, (12, 3))(preds, io["input.targets"], labels[:, :12])
    with pytest.raises(ValueError, match="sigmas"):
        PoseLoss(80, (17, 3), sigmas=[0.1] * 16)


def test_pose_model_train_output_feeds_the_loss() -> None:
    """YOLOv8n-pose in train mode (BatchNorm on batch statistics) into PoseLoss, and the gradient
    reaches the keypoint branch."""
    folder = fixture_dir("yolov8n_pose")
    vb = cn.VarBuilder.from_safetensors(folder / "weights.safetensors", device=cn.Device.cpu())
    model = YoloV8Pose.load(vb, "n", fold_bn=False).train()
    x = mx.array(np.random.default_rng(0).random((1, 64, 64, 3), np.float32))
    targets = np.array([[0, 0, 0.5, 0.5, 0.6, 0.8]], np.float32)
    keypoints = np.random.default_rng(1).uniform(0.3, 0.7, (1, 17, 3)).astype(np.float32)
    keypoints[..., 2] = 2
    criterion = PoseLoss(1)
    loss, grads = nn.value_and_grad(model, lambda m: criterion(m(x), targets, keypoints)[0])(model)
    assert np.isfinite(float(loss)) and float(loss) > 0
    kpt_grad = np.array(grads["head"]["cv4"][0]["layers"][2]["weight"])
    assert np.isfinite(kpt_grad).all() and np.abs(kpt_grad).max() > 0
