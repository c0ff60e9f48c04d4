"""YOLOv8-pose's training loss, ultralytics' ``v8PoseLoss``, on MLX arrays.

The detection loss (:class:`~.yolo_v8_loss.DetectionLoss`: the same assigner, box, class and DFL
terms) plus, on the anchors that learn a box, the keypoints of that box's person::

    criterion = PoseLoss(num_classes=1, kpt_shape=(17, 3))
    loss, items = criterion(model.train()(x), targets, keypoints)
    # model(x) in train mode: (feats, kpts), ultralytics' train-mode Pose output: feats per level
    #        (B, H, W, 64 + nc) as DetectionLoss reads them, kpts (B, A, 17 * 3) the raw keypoint
    #        outputs, anchor-major, per keypoint x, y, visibility logit
    # targets: (n, 6) as DetectionLoss's; keypoints: (n, 17, 3) x, y normalised to the input,
    #          visibility (0: not labelled)
    # items: (5,) box, pose, kobj, cls, dfl after the gains; loss = items.sum() * B

``pose`` is the OKS keypoint loss, the mean over (positive anchor, labelled keypoint) of
``1 - exp(-d² / (2 (2σ)² area))`` (``d`` the keypoint's error, ``area`` the box's, both in
feature-map cells, ``σ`` COCO's per-keypoint OKS sigma, or ``1 / K`` for other skeletons), scaled
per anchor by ``K / labelled keypoints``; ``kobj`` the binary cross-entropy of the visibility
logits against "labelled". Both are zero on a batch without positive anchors.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

import candle_nn as cn
import mlx.core as mx
import mlx.nn as nn

from .yolo_v8_boxes import xyxy2xywh
from .yolo_v8_assigner import Assignment
from .yolo_v8_loss import DetectionLoss, GroundTruth, Predictions, sum_all

__all__ = ["OKS_SIGMA", "PoseLoss"]

# COCO's per-keypoint OKS sigmas (nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles)
OKS_SIGMA = np.array([0.26, 0.25, 0.25, 0.35, 0.35, 0.79, 0.79, 0.72, 0.72, 0.62, 0.62, 1.07, 1.07,
                      0.87, 0.87, 0.89, 0.89], dtype=np.float32) / 10.0


class PoseLoss(DetectionLoss):
    """ultralytics' ``v8PoseLoss`` with its default gains.

    Args:
        num_classes: the head's class count (1 for ultralytics' pose models).
        kpt_shape: ``(K, 3)`` (x, y, visibility) or ``(K, 2)`` (x, y: no visibility logit).
        pose, kobj: the gains of the keypoint and visibility terms.
        sigmas: ``(K,)`` OKS sigmas; default COCO's for ``(17, 3)``, else ``1 / K`` each.
        The rest: as :class:`DetectionLoss`.

    Call ``criterion((feats, kpts), targets, keypoints) -> (loss, items)`` (see the module's
    docstring);
    ``keypoints`` ``(n, K, 3)`` or ``(n, K, 2)`` (then every keypoint counts as labelled), the rows
    of ``targets`` in the same order.
    """

    def __init__(self, num_classes: int = 1, kpt_shape: Sequence[int] = (17, 3),
                 strides: Sequence[int] = (8, 16, 32), reg_max: int = 16, box: float = 7.5,
                 cls: float = 0.5, dfl: float = 1.5, pose: float = 12.0, kobj: float = 1.0, *,
                 sigmas: Sequence[float] | None = None, topk: int = 10, alpha: float = 0.5,
                 beta: float = 6.0, device: cn.Device | None = None) -> None:
        super().__init__(num_classes, strides, reg_max, box, cls, dfl, topk=topk, alpha=alpha,
                         beta=beta, device=device)
        k, dim = (int(v) for v in kpt_shape)
        if dim not in (2, 3) or k < 1:
            raise ValueError(f"kpt_shape {tuple(kpt_shape)}: expected (K, 2) or (K, 3)")
        if sigmas is None:
            sigmas = OKS_SIGMA if (k, dim) == (17, 3) else np.full(k, 1 / k, np.float32)
        sigmas = np.asarray(sigmas, dtype=np.float32).reshape(-1)
        if len(sigmas) != k or not (sigmas > 0).all():
            raise ValueError(f"sigmas: expected {k} positive values, got {sigmas.tolist()}")
        self.kpt_shape = (k, dim)
        self.sigmas = mx.array(sigmas)
        self.pose_gains = (pose, kobj)

    def forward(self, preds: tuple[Sequence[mx.array], mx.array], targets, keypoints,
                max_boxes: int | None = None) -> tuple[mx.array, mx.array]:
        feats, kpts = preds
        pred = self.predictions(feats)
        gt = self.ground_truth(pred, targets, max_boxes)
        t = self.assign(pred, gt)
        box, cls, dfl = self.detection_items(pred, t)
        gt_kpts = self.ground_truth_keypoints(pred, gt, keypoints, targets.shape[0])
        pose, kobj = self.keypoint_items(pred, self.keypoint_logits(pred, kpts), gt, gt_kpts, t)
        items = mx.stack([box, pose, kobj, cls, dfl])
        return items.sum() * pred.scores.shape[0], mx.stop_gradient(items)

    def keypoint_logits(self, pred: Predictions, kpts: mx.array) -> mx.array:
        """``(B, A, K, dim)``: the raw keypoint outputs ``(B, A, K * dim)`` split per keypoint."""
        b, a = pred.scores.shape[:2]
        k, dim = self.kpt_shape
        if tuple(kpts.shape) != (b, a, k * dim):
            raise ValueError(f"keypoint outputs of shape {tuple(kpts.shape)}: expected (B={b}, "
                             f"anchors={a}, {k} keypoints x {dim})")
        return kpts.reshape(b, a, k, dim)

    def ground_truth_keypoints(self, pred: Predictions, gt: GroundTruth, keypoints,
                               n: int) -> mx.array:
        """``(B, M, K, 3)`` the keypoints of each ground-truth slot, x, y in input pixels, from
        ``keypoints`` ``(n, K, 3 or 2)`` (one per targets row)."""
        k = self.kpt_shape[0]
        shape = tuple(keypoints.shape)
        if len(shape) != 3 or shape[:2] != (n, k) or shape[2] not in (2, 3) or (
                isinstance(keypoints, np.ndarray) and not np.isfinite(keypoints).all()):
            raise ValueError(f"keypoints of shape {shape}: expected ({n}, {k}, 3) finite x, y, "
                             "visibility, one row per targets row")
        if isinstance(keypoints, np.ndarray):
            keypoints = mx.array(keypoints.astype(np.float32))
        if keypoints.shape[-1] == 2:
            keypoints = mx.concatenate([keypoints, mx.ones_like(keypoints[..., :1])], axis=-1)
        h, w = pred.imgsz
        kpts = keypoints.astype(mx.float32) * mx.array([w, h, 1], dtype=mx.float32)
        taken = (gt.rows >= 0)[..., None, None]
        return mx.where(taken, kpts[mx.maximum(gt.rows, 0)], 0)

    def keypoint_items(self, pred: Predictions, kpt_logits: mx.array, gt: GroundTruth,
                       gt_kpts: mx.array, t: Assignment) -> tuple[mx.array, mx.array]:
        """``(pose, kobj)`` after the gains, each a scalar (differentiable wrt ``kpt_logits``)."""
        b, a, k, dim = kpt_logits.shape
        strides = pred.strides  # (A, 1)
        xy = kpt_logits[..., :2] * 2.0 + (pred.anchors[:, None, :] - 0.5)  # feature-map cells
        # Each anchor's box's keypoints, in its map's cells.
        index = mx.broadcast_to(t.target_gt_idx[:, :, None, None], (b, a, k, 3))
        target = mx.take_along_axis(gt_kpts, index, axis=1)  # (B, A, K, 3)
        target_xy = target[..., :2] / strides[:, :, None]
        labelled = target[..., 2] != 0  # (B, A, K)
        area = xyxy2xywh(t.target_bboxes / strides)[..., 2:].prod(axis=-1)  # (B, A)
        d = mx.square(xy - target_xy).sum(axis=-1)
        e = d / (mx.square(2 * self.sigmas) * (area[..., None] + 1e-9) * 2)
        factor = k / (labelled.sum(axis=-1) + 1e-9)  # (B, A)
        fg = t.fg_mask[..., None]
        count = mx.maximum(t.fg_mask.sum() * k, 1).astype(d.dtype)  # positive (anchor, keypoint)s
        pose = sum_all(mx.where(fg & labelled, factor[..., None] * (1 - mx.exp(-e)), 0)) / count
        if dim == 3:
            bce = nn.losses.binary_cross_entropy(kpt_logits[..., 2], labelled.astype(d.dtype),
                                                 with_logits=True, reduction="none")
            kobj = sum_all(mx.where(fg, bce, 0)) / count
        else:
            kobj = mx.zeros((), d.dtype)
        return pose * self.pose_gains[0], kobj * self.pose_gains[1]
