"""ultralytics' ``TaskAlignedAssigner`` (Feng et al., TOOD, arXiv:2108.07755) on fixed shapes.

Which anchors learn which ground-truth box: for every (box, anchor) pair whose anchor centre lies
inside the box, the alignment metric ``score ** alpha * CIoU ** beta`` (the predicted score of the
box's class, the clamped CIoU of the predicted and true boxes); each box takes its ``topk`` anchors
by that metric; an anchor taken by several boxes keeps the one it overlaps most. The targets are
the assigned box and a one-hot class scaled by the normalised alignment (per box, the anchor with
the best metric gets the box's best overlap).

Ground truth is padded to ``(B, M)`` slots with a validity mask, so every shape is known ahead
and the whole assignment runs under ``mx.compile`` and on a GPU without reading anything back.
Where ultralytics selects candidate pairs with ``nonzero``, this computes all ``B x M x A`` pairs
and masks them: the same numbers.
"""

from __future__ import annotations

from typing import NamedTuple

import candle_nn as cn  # noqa: F401  (imported before mlx, as candle_nn/_startup.py asks)
import mlx.core as mx

from .yolo_v8_boxes import bbox_ciou, xywh2xyxy, xyxy2xywh


class Assignment(NamedTuple):
    """The assigner's targets for ``B`` images and ``A`` anchors.

    Attributes:
        target_labels: ``(B, A)`` int32 class of the assigned box (background anchors: the class
            of slot 0, as ultralytics).
        target_bboxes: ``(B, A, 4)`` xyxy of the assigned box in the ground truth's units (input
            pixels); background anchors get slot 0's box.
        target_scores: ``(B, A, num_classes)`` soft one-hot targets, zero on the background.
        fg_mask: ``(B, A)`` bool, the anchors that learn a box.
        target_gt_idx: ``(B, A)`` int32 slot of the assigned box in its image (0 on the
            background).
    """

    target_labels: mx.array
    target_bboxes: mx.array
    target_scores: mx.array
    fg_mask: mx.array
    target_gt_idx: mx.array


class TaskAlignedAssigner:
    """ultralytics' ``TaskAlignedAssigner(topk, num_classes, alpha, beta, stride)``.

    Args:
        topk: anchors each box takes. num_classes: class count.
        alpha, beta: exponents of the class score and the CIoU in the alignment metric.
        min_side: boxes narrower or lower than this (in the ground truth's units) look for anchor
            centres in a box widened to it about their centre; ultralytics uses the second
            stride (16).
        eps: ultralytics' guard against dividing by zero.
    """

    def __init__(self, topk: int = 13, num_classes: int = 80, alpha: float = 1.0,
                 beta: float = 6.0, min_side: float = 16.0, eps: float = 1e-9) -> None:
        self.topk, self.num_classes = topk, num_classes
        self.alpha, self.beta, self.min_side, self.eps = alpha, beta, min_side, eps

    def __call__(self, pd_scores: mx.array, pd_bboxes: mx.array, anc_points: mx.array,
                 gt_labels: mx.array, gt_bboxes: mx.array, mask_gt: mx.array) -> Assignment:
        """Assign ``M`` padded ground-truth slots to ``A`` anchors in each of ``B`` images.

        Args:
            pd_scores: ``(B, A, C)`` predicted class probabilities (after the sigmoid).
            pd_bboxes: ``(B, A, 4)`` predicted xyxy boxes. anc_points: ``(A, 2)`` anchor centres
                (both in the ground truth's units).
            gt_labels: ``(B, M, 1)`` classes. gt_bboxes: ``(B, M, 4)`` xyxy boxes.
            mask_gt: ``(B, M, 1)`` which slots hold a box.

        Nothing here is differentiated: the inputs are taken as constants.
        """
        pd_scores, pd_bboxes = mx.stop_gradient(pd_scores), mx.stop_gradient(pd_bboxes)
        b, a, nc = pd_scores.shape
        m = gt_bboxes.shape[1]
        if m == 0:
            return Assignment(mx.full((b, a), nc, dtype=mx.int32), mx.zeros_like(pd_bboxes),
                              mx.zeros_like(pd_scores), mx.zeros((b, a), dtype=mx.bool_),
                              mx.zeros((b, a), dtype=mx.int32))
        valid = mask_gt.astype(mx.bool_)  # (B, M, 1)
        labels = gt_labels[..., 0].astype(mx.int32)  # (B, M)
        in_gts = self._candidates_in_gts(anc_points, gt_bboxes, valid)  # (B, M, A)
        align, overlaps = self._box_metrics(pd_scores, pd_bboxes, labels, gt_bboxes,
                                            in_gts & valid)
        mask_pos = self._topk(align, valid) & in_gts & valid

        # An anchor taken by several boxes keeps the one it overlaps most (ties: the first).
        taken = mask_pos.sum(axis=1, keepdims=True) > 1  # (B, 1, A)
        slots = mx.arange(m, dtype=mx.int32)[None, :, None]
        best = mx.argmax(overlaps, axis=1).astype(mx.int32)[:, None, :]
        mask_pos = mx.where(taken, slots == best, mask_pos)
        fg_mask = mask_pos.any(axis=1)  # (B, A)
        target_gt_idx = mx.argmax(mask_pos, axis=1).astype(mx.int32)  # 0 on the background

        target_labels = mx.take_along_axis(labels, target_gt_idx, axis=1)
        target_bboxes = mx.take_along_axis(
            gt_bboxes, mx.broadcast_to(target_gt_idx[..., None], (b, a, 4)), axis=1)
        one_hot = mx.maximum(target_labels, 0)[..., None] == mx.arange(nc, dtype=mx.int32)
        target_scores = (one_hot & fg_mask[..., None]).astype(pd_scores.dtype)

        # Normalise: per box, the best-aligned anchor gets the box's best overlap.
        pos = mask_pos.astype(align.dtype)
        align = align * pos
        pos_align = align.max(axis=-1, keepdims=True)  # (B, M, 1)
        pos_overlaps = (overlaps * pos).max(axis=-1, keepdims=True)
        norm = (align * pos_overlaps / (pos_align + self.eps)).max(axis=1)  # (B, A)
        return Assignment(target_labels, target_bboxes, target_scores * norm[..., None], fg_mask,
                          target_gt_idx)

    def _candidates_in_gts(self, xy_centers: mx.array, gt_bboxes: mx.array,
                           valid: mx.array) -> mx.array:
        """``(B, M, A)``: anchor centres strictly inside each box (sides below ``min_side``
        widened to it about the box centre, as ultralytics)."""
        xywh = xyxy2xywh(gt_bboxes)
        wh = xywh[..., 2:]
        wh = mx.where((wh < self.min_side) & valid, mx.array(self.min_side, wh.dtype), wh)
        boxes = xywh2xyxy(mx.concatenate([xywh[..., :2], wh], axis=-1))[:, :, None, :]
        x, y = xy_centers[:, 0], xy_centers[:, 1]
        eps = self.eps
        return ((x - boxes[..., 0] > eps) & (y - boxes[..., 1] > eps)
                & (boxes[..., 2] - x > eps) & (boxes[..., 3] - y > eps))

    def _box_metrics(self, pd_scores: mx.array, pd_bboxes: mx.array, labels: mx.array,
                     gt_bboxes: mx.array, mask: mx.array) -> tuple[mx.array, mx.array]:
        """``(alignment metric, clamped CIoU)``, each ``(B, M, A)``, zero outside ``mask``."""
        b, a, _ = pd_scores.shape
        m = labels.shape[1]
        index = mx.broadcast_to(mx.maximum(labels, 0)[:, :, None], (b, m, a))
        scores = mx.take_along_axis(pd_scores.transpose(0, 2, 1), index, axis=1)  # (B, M, A)
        ciou = bbox_ciou(gt_bboxes[:, :, None, :], pd_bboxes[:, None, :, :])
        overlaps = mx.where(mask, mx.maximum(ciou, 0), 0)
        align = mx.where(mask, mx.power(scores, self.alpha) * mx.power(overlaps, self.beta), 0)
        return align, overlaps

    def _topk(self, metrics: mx.array, valid: mx.array) -> mx.array:
        """``(B, M, A)`` bool: each valid box's ``topk`` anchors by ``metrics``."""
        k = min(self.topk, metrics.shape[-1])
        idx = mx.argpartition(-metrics, kth=k - 1, axis=-1)[..., :k]
        chosen = mx.put_along_axis(mx.zeros(metrics.shape, dtype=mx.bool_), idx,
                                   mx.array(True), axis=-1)
        return chosen & valid
