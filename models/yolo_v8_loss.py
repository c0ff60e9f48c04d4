"""YOLOv8's training loss, ultralytics' ``v8DetectionLoss``, on MLX arrays.

``criterion(feats, targets)`` takes the train-mode head's three raw maps and the labels of the
batch and returns what ultralytics backpropagates::

    criterion = DetectionLoss(num_classes=80)
    loss, items = criterion(feats, targets)
    # feats: [(B, H/8, W/8, 64 + nc), (B, H/16, W/16, 64 + nc), (B, H/32, W/32, 64 + nc)]
    # targets: (n, 6) rows  image index, class, cx, cy, w, h  (box normalised to the input)
    # items: (3,) box, cls, dfl after the gains; loss = items.sum() * B

The three parts: the anchors the :class:`~.yolo_v8_assigner.TaskAlignedAssigner` matches to a
box learn it by CIoU and by the distribution focal loss (DFL) of their ``reg_max``-bin side
distances, each weighted by the anchor's target score; every anchor learns the soft one-hot class
targets by binary cross-entropy. Sums are divided by the total target score.

Targets are padded on the device into ``(B, M, ...)`` slots, so the whole loss runs under
``mx.compile``: ``M`` is ``max_boxes`` when given, else for NumPy targets the fullest image's count
rounded up to 8, for ``mx.array`` targets ``n`` (room for every row). Rows whose image index is
negative are padding (a trainer may pad ``n`` to a few fixed sizes to keep the compiled shapes
few). Targets are checked (:func:`check_targets`) on the host when they can be read there: NumPy
ones, and ``mx.array`` ones outside a transformation; under ``mx.compile`` the caller checks them
(the trainer does), and a row that is not a box (a coordinate not finite, a class or image index out
of range) is dropped on the device, as padding, never read as an index.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

import candle_nn as cn
import mlx.core as mx
import mlx.nn as nn

from .yolo_v8_assigner import Assignment, TaskAlignedAssigner
from .yolo_v8_boxes import bbox2dist, bbox_ciou, dist2bbox, xywh2xyxy
from .yolo_v8_head import make_anchors

__all__ = ["DetectionLoss", "GroundTruth", "Predictions", "check_targets", "pad_targets", "sum_all"]

BOX_SLACK = 1e-3  # how far outside 0..1 a normalised box coordinate may lie


def sum_all(x: mx.array) -> mx.array:
    """Sum of all elements, one axis at a time from the last: in float32 as accurate as
    PyTorch's (MLX's one-pass CPU sum of YOLOv8's 1.3 M class terms is off by 1e-4)."""
    for _ in range(x.ndim):
        x = x.sum(axis=-1)
    return x


class GroundTruth(NamedTuple):
    """Padded ground truth, ``M`` slots per image.

    Attributes:
        labels: ``(B, M, 1)`` classes (float, as ultralytics). bboxes: ``(B, M, 4)`` xyxy in
        input pixels (zero in empty slots). mask: ``(B, M, 1)`` which slots hold a box.
        rows: ``(B, M)`` int32 the ``targets`` row in each slot (-1 when empty).
    """

    labels: mx.array
    bboxes: mx.array
    mask: mx.array
    rows: mx.array


class Predictions(NamedTuple):
    """The head's raw maps as the loss reads them (``A`` anchors, ultralytics' order).

    Attributes:
        distri: ``(B, A, 4 * reg_max)`` side-distance logits. scores: ``(B, A, nc)`` class logits.
        anchors: ``(A, 2)`` anchor centres in feature-map cells. strides: ``(A, 1)``.
        bboxes: ``(B, A, 4)`` decoded xyxy boxes in feature-map cells.
        imgsz: the input's ``(height, width)`` in pixels.
    """

    distri: mx.array
    scores: mx.array
    anchors: mx.array
    strides: mx.array
    bboxes: mx.array
    imgsz: tuple[int, int]


def check_targets(targets: np.ndarray, batch_size: int, num_classes: int,
                  columns: int = 6) -> None:
    """Raise ``ValueError`` naming the first bad row of host ``targets`` (shape, image index,
    class, a finite box normalised to the input: ``cx, cy, w, h`` in 0..1)."""
    if targets.ndim != 2 or targets.shape[1] != columns:
        raise ValueError(f"targets of shape {tuple(targets.shape)}: expected (n, {columns}) rows "
                         "image index, class, cx, cy, w, h")
    image, cls, box = targets[:, 0], targets[:, 1], targets[:, 2:6]
    with np.errstate(invalid="ignore"):
        # the augmentations' rounding leaves boxes a hair outside 0..1; pixels are far outside
        outside = ((box < -BOX_SLACK) | (box > 1 + BOX_SLACK)).any(axis=1)
        bad = (~np.isfinite(image) | (image != np.round(image)) | (image >= batch_size)
               | ((image >= 0) & ((cls != np.round(cls)) | (cls < 0) | (cls >= num_classes)
                                  | ~np.isfinite(box).all(axis=1) | outside)))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"targets row {row} = {targets[row, :6].tolist()}: needs an image index "
                         f"below the batch size {batch_size} (negative: padding), a class in "
                         f"0..{num_classes - 1} and a finite box cx, cy, w, h normalised to the "
                         "input (0..1; divide pixel boxes by the input's width and height)")


def pad_targets(targets: mx.array, batch_size: int, imgsz: tuple[int, int],
                max_boxes: int | None = None, num_classes: int | None = None) -> GroundTruth:
    """``(n, 6)`` rows ``image index, class, cx, cy, w, h`` (normalised) → :class:`GroundTruth`
    with ``M = max_boxes`` slots per image (default ``n``: room for every row), each image's rows
    in their order (ultralytics' layout). Rows with a negative image index are dropped, and so
    are an image's rows beyond ``M`` (the caller's ``max_boxes`` must cover the fullest image),
    rows with a coordinate that is not finite, an image index from ``batch_size`` on and a class
    outside ``0..num_classes - 1`` (when given). Runs on the device."""
    n = targets.shape[0]
    m = n if max_boxes is None else max_boxes
    # a row that is not a box is dead before anything reads its image index or class as an
    # index (a NaN cast to int32 is any number: an out-of-bounds scatter crashes)
    finite = mx.isfinite(targets[:, :6]).all(axis=-1)
    targets = mx.where(finite[:, None], targets, 0)
    image = mx.where(finite, targets[:, 0], -1).astype(mx.int32)
    cls = targets[:, 1]
    live = (image >= 0) & (image < batch_size) & (cls >= 0)
    if num_classes is not None:
        live = live & (cls < num_classes)
    # A row's slot: how many earlier rows belong to its image.
    earlier = mx.arange(n)[:, None] < mx.arange(n)[None, :]
    slot = ((image[:, None] == image[None, :]) & earlier).sum(axis=0).astype(mx.int32)
    flat = mx.where(live & (slot < m), image * m + slot, batch_size * m)  # dead: a spare slot
    h, w = imgsz
    scale = mx.array([w, h, w, h], dtype=mx.float32)
    rows = mx.concatenate([targets[:, 1:2].astype(mx.float32),
                           xywh2xyxy(targets[:, 2:6].astype(mx.float32) * scale)], axis=-1)
    padded = mx.zeros((batch_size * m + 1, 5), dtype=mx.float32).at[flat].add(rows)
    index = mx.full((batch_size * m + 1,), -1, dtype=mx.int32).at[flat].add(
        mx.arange(n, dtype=mx.int32) + 1)
    padded = padded[:-1].reshape(batch_size, m, 5)
    bboxes = padded[..., 1:]
    mask = bboxes.sum(axis=-1, keepdims=True) > 0  # ultralytics' mask_gt
    return GroundTruth(padded[..., :1], bboxes, mask, index[:-1].reshape(batch_size, m))


class DetectionLoss(cn.Module):
    """ultralytics' ``v8DetectionLoss`` with its default gains.

    Args:
        num_classes: the head's class count. strides: of the three maps.
        reg_max: DFL bins per box side. box, cls, dfl: the gains of the three parts.
        topk, alpha, beta: the :class:`TaskAlignedAssigner`'s (ultralytics' 10, 0.5, 6).
        device: where the loss runs (a Device or ``"cpu"``, ``"gpu:0"``); ``None`` (default): on
            the caller's stream.
        group: an ``mx.distributed`` group whose processes each hold part of one batch (data
            parallelism): the total target score that divides the three sums is the whole
            batch's (an all-reduce), so the processes' items add up to the whole batch's and
            their gradients sum to the one-process gradient (ultralytics' DDP divides by each
            process's own total instead). ``None``: one process.

    Call ``criterion(feats, targets) -> (loss, items)``: ``feats`` the head's per-level raw maps
    ``(B, H_i, W_i, 4 * reg_max + num_classes)`` (NHWC; box logits first, as ultralytics'
    ``Detect`` concatenates them), ``targets`` ``(n, 6)`` (an ``mx.array`` or NumPy; NumPy rows
    are checked first), ``items`` ``(3,)`` box, cls, dfl after the gains (no gradient), ``loss``
    ``items.sum() * batch_size`` (the scalar to differentiate; ``batch_size`` defaults to this
    batch's ``B``, under data parallelism pass the whole batch's). ``max_boxes``: ground-truth
    slots per image (see :meth:`ground_truth`; the assigner's memory is ``B x max_boxes x
    anchors``).
    """

    def __init__(self, num_classes: int, strides: Sequence[int] = (8, 16, 32), reg_max: int = 16,
                 box: float = 7.5, cls: float = 0.5, dfl: float = 1.5, *, topk: int = 10,
                 alpha: float = 0.5, beta: float = 6.0, device: "cn.Device | str | None" = None,
                 group: "mx.distributed.Group | None" = None) -> None:
        super().__init__(device)
        self.group = group if group is not None and group.size() > 1 else None
        self.num_classes, self.strides, self.reg_max = num_classes, tuple(strides), reg_max
        self.gains = (box, cls, dfl)
        # ultralytics widens tiny boxes to the second stride when looking for anchors inside
        min_side = self.strides[min(1, len(self.strides) - 1)]
        self.assigner = TaskAlignedAssigner(topk=topk, num_classes=num_classes, alpha=alpha,
                                            beta=beta, min_side=min_side)

    def forward(self, feats: Sequence[mx.array], targets, max_boxes: int | None = None,
                batch_size: int | None = None) -> tuple[mx.array, mx.array]:
        pred = self.predictions(feats)
        gt = self.ground_truth(pred, targets, max_boxes)
        items = self.detection_items(pred, self.assign(pred, gt))
        b = pred.scores.shape[0] if batch_size is None else batch_size
        return items.sum() * b, mx.stop_gradient(items)

    # The steps, public for the trainer's logging and the parity tests.

    def predictions(self, feats: Sequence[mx.array]) -> Predictions:
        """Split and decode the head's maps (see :class:`Predictions`), in float32 whatever their
        dtype (a float16 model's loss keeps float32's precision; its gradient flows back)."""
        if len(feats) != len(self.strides):
            raise ValueError(f"{len(feats)} feature maps for {len(self.strides)} strides")
        b, no = feats[0].shape[0], 4 * self.reg_max + self.num_classes
        for f in feats:
            if f.ndim != 4 or f.shape[0] != b or f.shape[-1] < no:
                raise ValueError(f"feature map of shape {tuple(f.shape)}: expected (B={b}, H, W, "
                                 f"{no}) = 4 * reg_max box logits + {self.num_classes} classes")
        flat = mx.concatenate([f[..., :no].reshape(b, -1, no) for f in feats], axis=1)
        flat = flat.astype(mx.float32)
        distri, scores = flat[..., :4 * self.reg_max], flat[..., 4 * self.reg_max:]
        anchors, strides = make_anchors([tuple(f.shape[1:3]) for f in feats], self.strides,
                                        flat.dtype)
        proj = mx.arange(self.reg_max, dtype=flat.dtype)
        dist = mx.softmax(distri.reshape(b, -1, 4, self.reg_max), axis=-1, precise=True) @ proj
        imgsz = (feats[0].shape[1] * self.strides[0], feats[0].shape[2] * self.strides[0])
        return Predictions(distri, scores, anchors, strides,
                           dist2bbox(dist, anchors, xywh=False), imgsz)

    def ground_truth(self, pred: Predictions, targets,
                     max_boxes: int | None = None) -> GroundTruth:
        """:func:`pad_targets` for this batch. NumPy targets are checked first, and without
        ``max_boxes`` get as many slots as the fullest image needs, rounded up to a multiple of 8
        (ultralytics' memory, few distinct shapes); ``mx.array`` targets get ``n`` slots."""
        b = pred.scores.shape[0]
        if isinstance(targets, np.ndarray):
            check_targets(targets, b, self.num_classes)
            image = targets[:, 0].astype(np.int64)
            fullest = int(np.bincount(image[image >= 0], minlength=1).max())
            if max_boxes is None:
                max_boxes = -(-fullest // 8) * 8
            elif max_boxes < fullest:
                raise ValueError(f"max_boxes {max_boxes}: an image of this batch has {fullest} "
                                 "boxes")
            targets = mx.array(targets.astype(np.float32))
        else:
            try:
                host = np.array(targets)
            except ValueError:  # under mx.compile: the caller checks (dead rows are dropped)
                if targets.ndim != 2 or targets.shape[1] != 6:
                    raise ValueError(f"targets of shape {tuple(targets.shape)}: expected (n, 6) "
                                     "rows image index, class, cx, cy, w, h") from None
            else:
                check_targets(host, b, self.num_classes)
        return pad_targets(targets, b, pred.imgsz, max_boxes, self.num_classes)

    def assign(self, pred: Predictions, gt: GroundTruth) -> Assignment:
        """The assigner's targets (boxes in input pixels, as ultralytics returns them)."""
        return self.assigner(mx.sigmoid(pred.scores), pred.bboxes * pred.strides,
                             pred.anchors * pred.strides, gt.labels, gt.bboxes, gt.mask)

    def detection_items(self, pred: Predictions, t: Assignment) -> mx.array:
        """``(3,)`` box, cls and dfl losses after the gains (differentiable wrt ``pred``)."""
        scores_sum = mx.stop_gradient(sum_all(t.target_scores))
        if self.group is not None:
            scores_sum = mx.distributed.all_sum(scores_sum, group=self.group)
        scores_sum = mx.maximum(scores_sum, 1)
        cls = sum_all(nn.losses.binary_cross_entropy(pred.scores, t.target_scores,
                                                    with_logits=True, reduction="none"))
        cls = cls / scores_sum
        target_bboxes = t.target_bboxes / pred.strides
        weight = t.target_scores.sum(axis=-1)  # (B, A), zero on the background
        iou = bbox_ciou(pred.bboxes, target_bboxes)
        box = sum_all(mx.where(t.fg_mask, (1 - iou) * weight, 0)) / scores_sum
        ltrb = bbox2dist(pred.anchors, target_bboxes, self.reg_max - 1)
        dfl = sum_all(mx.where(t.fg_mask, self._dfl(pred.distri, ltrb) * weight, 0)) / scores_sum
        return mx.stack([box, cls, dfl]) * mx.array(self.gains, dtype=box.dtype)

    def _dfl(self, distri: mx.array, target: mx.array) -> mx.array:
        """Distribution focal loss (Li et al., arXiv:2006.04388) ``(B, A)``: per side, the
        cross-entropy with the two bins around the target distance, weighted by nearness;
        averaged over the four sides."""
        b, a, _ = distri.shape
        target = mx.clip(target, 0, self.reg_max - 1 - 0.01)
        left = mx.floor(target).astype(mx.int32)
        w_left = (left + 1).astype(target.dtype) - target
        logits = distri.reshape(b, a, 4, self.reg_max)
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        lp_left = mx.take_along_axis(logp, left[..., None], axis=-1)[..., 0]
        lp_right = mx.take_along_axis(logp, left[..., None] + 1, axis=-1)[..., 0]
        return -(lp_left * w_left + lp_right * (1 - w_left)).mean(axis=-1)
