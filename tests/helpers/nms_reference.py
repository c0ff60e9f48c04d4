"""Greedy NMS written as plain Python loops, and clustered random boxes with many score ties: the
reference for candle_nn_models.yolo_v8_post's NMS and the CLI's NMS options."""

from __future__ import annotations

import numpy as np


def box_iou(a, b) -> float:
    """Plain-Python IoU of two xyxy boxes (torchvision's convention)."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def reference_nms(boxes, scores, iou_threshold, classes) -> list[int]:
    """Greedy NMS as plain Python loops: best first, drop same-class boxes above the threshold."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    suppressed = [False] * len(scores)
    keep = []
    for pos, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(i)
        for j in order[pos + 1:]:
            if suppressed[j] or classes[j] != classes[i]:
                continue
            if box_iou(boxes[i], boxes[j]) > iou_threshold:
                suppressed[j] = True
    return keep


def random_boxes(n: int, classes: int, seed: int):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0, 640, (n // 20 + 1, 2))[rng.integers(0, n // 20 + 1, n)]
    centres += rng.normal(0, 8, (n, 2))  # clusters of overlapping boxes
    wh = rng.uniform(10, 80, (n, 2))
    boxes = np.concatenate([centres - wh / 2, centres + wh / 2], axis=1)
    scores = np.round(rng.uniform(0, 1, n), 2)  # rounding makes many ties
    return boxes, scores, rng.integers(0, classes, n)
