"""The YOLOv8 loss tests' reference: ultralytics' ``v8DetectionLoss`` given the assigner's targets,
written out in torch (float64) from ultralytics' formulas, and the fixture's head outputs as the
loss reads them."""

from __future__ import annotations

import math

import numpy as np
import torch

import candle_nn as cn  # noqa: F401  (before mlx, as candle_nn/_startup.py asks)
import mlx.core as mx

SIZES = (80, 40, 20)  # the yolov8n_loss fixture's feature maps (640 / 8, 16, 32)


def feats_of(io: dict[str, np.ndarray]) -> list[mx.array]:
    """The head's raw output per level, NHWC ``(B, H, W, 64 + 80)``, from the fixture's
    anchor-major ``boxes`` and ``scores``."""
    raw = np.concatenate([io["output.boxes"], io["output.scores"]], axis=1).transpose(0, 2, 1)
    feats, start = [], 0
    for s in SIZES:
        level = raw[:, start:start + s * s].reshape(len(raw), s, s, -1)
        feats.append(mx.array(np.ascontiguousarray(level)))
        start += s * s
    return feats


def rel_l2(candidate, reference) -> float:
    """``||candidate - reference|| / ||reference||`` (the fixtures' ``rtol_l2`` measure)."""
    candidate, reference = (np.asarray(a, dtype=np.float64) for a in (candidate, reference))
    return float(np.linalg.norm(candidate - reference) / np.linalg.norm(reference))


def anchors_and_strides() -> tuple[torch.Tensor, torch.Tensor]:
    """ultralytics' make_anchors for the fixture's maps, float64: ``(A, 2)``, ``(A, 1)``."""
    anchors, strides = [], []
    for s, stride in zip(SIZES, (8, 16, 32)):
        sy, sx = torch.meshgrid(torch.arange(s) + 0.5, torch.arange(s) + 0.5, indexing="ij")
        anchors.append(torch.stack([sx, sy], -1).view(-1, 2))
        strides.append(torch.full((s * s, 1), float(stride)))
    return torch.cat(anchors).double(), torch.cat(strides).double()


def torch_ciou(b1: torch.Tensor, b2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """ultralytics.utils.metrics.bbox_iou(b1, b2, xywh=False, CIoU=True), xyxy ``(N, 4)``."""
    b1_x1, b1_y1, b1_x2, b1_y2 = b1.unbind(-1)
    b2_x1, b2_y1, b2_x2, b2_y2 = b2.unbind(-1)
    w1, h1 = b1_x2 - b1_x1, b1_y2 - b1_y1 + eps
    w2, h2 = b2_x2 - b2_x1, b2_y2 - b2_y1 + eps
    inter = ((b1_x2.minimum(b2_x2) - b1_x1.maximum(b2_x1)).clamp(0)
             * (b1_y2.minimum(b2_y2) - b1_y1.maximum(b2_y1)).clamp(0))
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = b1_x2.maximum(b2_x2) - b1_x1.minimum(b2_x1)
    ch = b1_y2.maximum(b2_y2) - b1_y1.minimum(b2_y1)
    c2 = cw ** 2 + ch ** 2 + eps
    rho2 = ((b2_x1 + b2_x2 - b1_x1 - b1_x2) ** 2 + (b2_y1 + b2_y2 - b1_y1 - b1_y2) ** 2) / 4
    v = (4 / math.pi ** 2) * ((w2 / h2).atan() - (w1 / h1).atan()) ** 2
    with torch.no_grad():
        alpha = v / (1 - iou + v + eps)
    return iou - (rho2 / c2 + v * alpha)


def torch_loss(boxes: torch.Tensor, scores: torch.Tensor, io: dict[str, np.ndarray]):
    """ultralytics' loss (box, cls, dfl gains 7.5, 0.5, 1.5; × batch size) of the raw outputs
    ``boxes`` (B, 64, A) and ``scores`` (B, 80, A), given the fixture's assigner outputs."""
    b = boxes.shape[0]
    distri, logits = boxes.permute(0, 2, 1), scores.permute(0, 2, 1)
    anchors, strides = anchors_and_strides()
    dist = distri.view(b, -1, 4, 16).softmax(3) @ torch.arange(16).double()
    pred_bboxes = torch.cat([anchors - dist[..., :2], anchors + dist[..., 2:]], -1)
    target_bboxes = torch.from_numpy(io["output.target_bboxes"]).double() / strides
    target_scores = torch.from_numpy(io["output.target_scores"]).double()
    fg = torch.from_numpy(io["output.fg_mask"]) > 0
    tss = target_scores.sum().clamp(min=1)
    cls = torch.nn.functional.binary_cross_entropy_with_logits(
        logits, target_scores, reduction="sum") / tss
    weight = target_scores[fg].sum(-1, keepdim=True)
    iou = torch_ciou(pred_bboxes[fg], target_bboxes[fg]).unsqueeze(-1)
    box = ((1.0 - iou) * weight).sum() / tss
    ltrb = torch.cat([anchors - target_bboxes[..., :2], target_bboxes[..., 2:] - anchors], -1)
    target = ltrb.clamp(0, 15 - 0.01)[fg]
    tl = target.long()
    wl = tl + 1 - target
    logp = distri[fg].reshape(-1, 4, 16).log_softmax(-1)
    dfl = -(logp.gather(-1, tl[..., None])[..., 0] * wl
            + logp.gather(-1, tl[..., None] + 1)[..., 0] * (1 - wl)).mean(-1, keepdim=True)
    dfl = (dfl * weight).sum() / tss
    items = torch.stack([box * 7.5, cls * 0.5, dfl * 1.5])
    return items.sum() * b, items
