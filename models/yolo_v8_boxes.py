"""YOLOv8's box geometry on MLX arrays, as ultralytics computes it (the same float32 operations in
the same order): box formats, anchor distances and the Complete IoU.

Boxes are ``(..., 4)``: ``xyxy`` corners ``x1, y1, x2, y2`` or ``xywh`` centre and size. Distances
``ltrb`` are an anchor's distances to a box's left, top, right and bottom sides. Everything
broadcasts over the leading dimensions.
"""

from __future__ import annotations

import math

import candle_nn as cn  # noqa: F401  (imported before mlx, as candle_nn/_startup.py asks)
import mlx.core as mx


def xywh2xyxy(x: mx.array) -> mx.array:
    """``(..., 4)`` centre x, y, width, height → corners x1, y1, x2, y2."""
    xy, half = x[..., :2], x[..., 2:] / 2
    return mx.concatenate([xy - half, xy + half], axis=-1)


def xyxy2xywh(x: mx.array) -> mx.array:
    """``(..., 4)`` corners x1, y1, x2, y2 → centre x, y, width, height."""
    x1y1, x2y2 = x[..., :2], x[..., 2:]
    return mx.concatenate([(x1y1 + x2y2) / 2, x2y2 - x1y1], axis=-1)


def dist2bbox(distance: mx.array, anchor_points: mx.array, xywh: bool = True) -> mx.array:
    """Boxes from ``ltrb`` distances ``(..., 4)`` to anchor points ``(..., 2)``: ``xywh`` (default)
    or ``xyxy``, in the units of the inputs."""
    x1y1 = anchor_points - distance[..., :2]
    x2y2 = anchor_points + distance[..., 2:]
    if xywh:
        return mx.concatenate([(x1y1 + x2y2) / 2, x2y2 - x1y1], axis=-1)
    return mx.concatenate([x1y1, x2y2], axis=-1)


def bbox2dist(anchor_points: mx.array, bbox: mx.array, reg_max: int | None = None) -> mx.array:
    """``ltrb`` distances ``(..., 4)`` from anchor points ``(..., 2)`` to ``xyxy`` boxes; with
    ``reg_max``, clipped to ``[0, reg_max - 0.01]`` (the last DFL bin's left edge)."""
    dist = mx.concatenate([anchor_points - bbox[..., :2], bbox[..., 2:] - anchor_points], axis=-1)
    if reg_max is not None:
        dist = mx.clip(dist, 0, reg_max - 0.01)
    return dist


def bbox_ciou(box1: mx.array, box2: mx.array, eps: float = 1e-7) -> mx.array:
    """Complete IoU (Zheng et al., arXiv:1911.08287) of ``xyxy`` boxes ``(..., 4)`` → ``(...)``.

    ultralytics' ``bbox_iou(box1, box2, xywh=False, CIoU=True)``: IoU minus the normalised centre
    distance and the aspect-ratio term ``v * alpha``, with ``alpha`` a constant for the gradient.
    In ``[-1, 1]``; 1 for identical boxes.
    """
    b1_x1, b1_y1, b1_x2, b1_y2 = (box1[..., i] for i in range(4))
    b2_x1, b2_y1, b2_x2, b2_y2 = (box2[..., i] for i in range(4))
    w1, h1 = b1_x2 - b1_x1, b1_y2 - b1_y1 + eps
    w2, h2 = b2_x2 - b2_x1, b2_y2 - b2_y1 + eps
    inter = (_clamp_min0(_minimum(b1_x2, b2_x2) - _maximum(b1_x1, b2_x1))
             * _clamp_min0(_minimum(b1_y2, b2_y2) - _maximum(b1_y1, b2_y1)))
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = _maximum(b1_x2, b2_x2) - _minimum(b1_x1, b2_x1)  # smallest enclosing box
    ch = _maximum(b1_y2, b2_y2) - _minimum(b1_y1, b2_y1)
    c2 = mx.square(cw) + mx.square(ch) + eps  # its diagonal, squared
    rho2 = (mx.square(b2_x1 + b2_x2 - b1_x1 - b1_x2)
            + mx.square(b2_y1 + b2_y2 - b1_y1 - b1_y2)) / 4  # centre distance, squared
    v = (4 / math.pi ** 2) * mx.square(mx.arctan(w2 / h2) - mx.arctan(w1 / h1))
    alpha = mx.stop_gradient(v / (1 - iou + v + eps))
    return iou - (rho2 / c2 + v * alpha)


# PyTorch's subgradients, which ultralytics' CIoU takes where boxes share an edge or touch: MLX's
# ``minimum`` / ``maximum`` give a tie's whole gradient to one side, PyTorch's split it in half;
# MLX's ``maximum(x, 0)`` passes none at 0, PyTorch's ``clamp(min=0)`` passes all of it. The
# values are the same (a tie's mean is either side, NaN stays NaN).


def _minimum(a: mx.array, b: mx.array) -> mx.array:
    return mx.where(a < b, a, mx.where(b < a, b, (a + b) / 2))


def _maximum(a: mx.array, b: mx.array) -> mx.array:
    return mx.where(a > b, a, mx.where(b > a, b, (a + b) / 2))


def _clamp_min0(x: mx.array) -> mx.array:
    return mx.where(x < 0, 0, x)
