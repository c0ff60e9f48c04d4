"""Detection metrics exactly as ultralytics' validator computes them (NumPy, on the host).

Per image, :func:`match_predictions` marks each detection correct or not at the ten IoU thresholds
0.50, 0.55, ..., 0.95 (greedy: detections in descending confidence each claim the unclaimed box of
their class they overlap most); over the whole set, :func:`ap_per_class` turns those marks into
per-class average precision (COCO's 101-point interpolated AP of the precision envelope) and the
precision and recall at the confidence where the class-mean F1 (smoothed) is highest.
:class:`DetectionMetrics` accumulates images and reports P, R, mAP50 and mAP50-95 per class and
overall (ultralytics' ``DetMetrics``)::

    metrics = DetectionMetrics(names)
    for image in images:
        metrics.update(pred_boxes, pred_conf, pred_cls, gt_boxes, gt_cls)  # xyxy, same units
    results = metrics.results()
    print(results.table())
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from candle_nn.cli import printable

__all__ = ["IOU_THRESHOLDS", "APResult", "ClassResult", "DetectionMetrics", "DetectionResults",
           "ap_per_class", "box_iou", "compute_ap", "match_predictions", "smooth"]

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10).astype(np.float32)  # mAP50-95's ten
_AP_RECALLS = np.linspace(0, 1, 101)  # COCO's 101 recall points
_CURVE_X = np.linspace(0, 1, 1000)  # the confidence axis of the P, R and F1 curves
_trapezoid = getattr(np, "trapezoid", None) or np.trapz  # NumPy < 2 names it trapz


def box_iou(box1: np.ndarray, box2: np.ndarray, eps: float = 1e-7) -> np.ndarray:
    """IoU ``(N, M)`` float32 of xyxy boxes ``(N, 4)`` and ``(M, 4)`` (float32, as ultralytics)."""
    a = np.asarray(box1, dtype=np.float32).reshape(-1, 4)[:, None]
    b = np.asarray(box2, dtype=np.float32).reshape(-1, 4)[None]
    wh = np.clip(np.minimum(a[..., 2:], b[..., 2:]) - np.maximum(a[..., :2], b[..., :2]), 0, None)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    return inter / (area_a + area_b - inter + np.float32(eps))


def match_predictions(pred_classes: np.ndarray, true_classes: np.ndarray, iou: np.ndarray,
                      thresholds: np.ndarray = IOU_THRESHOLDS) -> np.ndarray:
    """``(D, T)`` bool: whether each detection is a true positive at each IoU threshold.

    Args:
        pred_classes: ``(D,)`` detection classes, in descending confidence.
        true_classes: ``(L,)`` ground-truth classes. iou: ``(L, D)`` their IoUs.

    Per threshold, detections in order each take the not-yet-claimed box of their class with the
    highest IoU (the first on ties); a detection whose best such IoU reaches the threshold is
    correct and claims that box.
    """
    iou = np.where(np.asarray(true_classes)[:, None] == np.asarray(pred_classes)[None], iou, 0)
    iou = iou.astype(np.float32)
    n_t = len(thresholds)
    correct = np.zeros((iou.shape[1], n_t), dtype=bool)
    claimed = np.zeros((iou.shape[0], n_t), dtype=bool)
    columns = np.arange(n_t)
    for j in np.flatnonzero((iou >= thresholds.min()).any(axis=0)):
        free = np.where(claimed, np.float32(0), iou[:, j, None])  # (L, T)
        best = free.argmax(axis=0)
        correct[j] = free[best, columns] >= thresholds
        claimed[best, columns] |= correct[j]
    return correct


def smooth(y: np.ndarray, f: float = 0.05) -> np.ndarray:
    """Moving average of width ``f`` of the length (odd), the ends padded with the end values."""
    n = round(len(y) * f * 2) // 2 + 1
    pad = np.ones(n // 2)
    return np.convolve(np.concatenate([pad * y[0], y, pad * y[-1]]), np.ones(n) / n, "valid")


def compute_ap(recall: np.ndarray, precision: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """``(AP, precision envelope, recall)`` of one precision-recall curve: the curve with
    sentinels (recall 0 at precision 1, then the last recall and 1 at precision 0), made
    non-increasing from the right, integrated by the trapezoid rule at 101 recall points."""
    last = recall[-1] if len(recall) else 1.0
    mrec = np.concatenate([[0.0], recall, [last], [1.0]])
    mpre = np.concatenate([[1.0], precision, [0.0], [0.0]])
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    ap = _trapezoid(np.interp(_AP_RECALLS, mrec, mpre), _AP_RECALLS)
    return float(ap), mpre, mrec


@dataclass
class APResult:
    """What :func:`ap_per_class` finds, one row per class that has labels.

    Attributes:
        classes: ``(C,)`` those classes, ascending. ap: ``(C, 10)`` AP at each IoU threshold.
        p, r, f1: ``(C,)`` at the confidence of the best class-mean F1. tp, fp: ``(C,)`` counts
        there. p_curve, r_curve, f1_curve: ``(C, 1000)`` over confidence ``px``; prec_values:
        ``(C, 1000)`` precision over recall ``px`` at IoU 0.5.
    """

    classes: np.ndarray
    ap: np.ndarray
    p: np.ndarray
    r: np.ndarray
    f1: np.ndarray
    tp: np.ndarray
    fp: np.ndarray
    p_curve: np.ndarray
    r_curve: np.ndarray
    f1_curve: np.ndarray
    px: np.ndarray
    prec_values: np.ndarray


def ap_per_class(tp: np.ndarray, conf: np.ndarray, pred_cls: np.ndarray, target_cls: np.ndarray,
                 eps: float = 1e-16) -> APResult:
    """ultralytics' ``ap_per_class`` over a whole set.

    Args:
        tp: ``(D, T)`` :func:`match_predictions` of every detection. conf: ``(D,)`` their scores.
        pred_cls: ``(D,)`` their classes. target_cls: ``(L,)`` every ground-truth box's class.

    Detections of classes without labels do not count.
    """
    tp, conf, pred_cls = np.asarray(tp), np.asarray(conf), np.asarray(pred_cls)
    order = np.argsort(-conf)  # ultralytics' (default, unstable) sort: ties fall as it has them
    tp, conf, pred_cls = tp[order], conf[order], pred_cls[order]
    classes, n_labels = np.unique(np.asarray(target_cls), return_counts=True)
    nc, x = len(classes), _CURVE_X
    ap = np.zeros((nc, tp.shape[1]))
    p_curve, r_curve, prec_values = np.zeros((nc, 1000)), np.zeros((nc, 1000)), []
    for ci, c in enumerate(classes):
        mine = pred_cls == c
        if not mine.any():
            prec_values.append(np.zeros_like(x))
            continue
        tpc = tp[mine].cumsum(axis=0)
        fpc = (1 - tp[mine]).cumsum(axis=0)
        recall = tpc / (n_labels[ci] + eps)
        precision = tpc / (tpc + fpc)
        # np.interp needs increasing x: confidence decreases along the detections.
        r_curve[ci] = np.interp(-x, -conf[mine], recall[:, 0], left=0)
        p_curve[ci] = np.interp(-x, -conf[mine], precision[:, 0], left=1)
        for j in range(tp.shape[1]):
            ap[ci, j], mpre, mrec = compute_ap(recall[:, j], precision[:, j])
            if j == 0:
                prec_values.append(np.interp(x, mrec, mpre))
    f1_curve = 2 * p_curve * r_curve / (p_curve + r_curve + eps)
    i = smooth(f1_curve.mean(axis=0), 0.1).argmax() if nc else 0
    p, r, f1 = p_curve[:, i], r_curve[:, i], f1_curve[:, i]
    tps = (r * n_labels).round()
    fps = (tps / (p + eps) - tps).round()
    return APResult(classes.astype(int), ap, p, r, f1, tps, fps, p_curve, r_curve, f1_curve, x,
                    np.array(prec_values) if prec_values else np.zeros((1, 1000)))


@dataclass
class ClassResult:
    """One row of the table: ``name``, ``images`` holding the class, its ``instances`` (boxes),
    precision ``p``, recall ``r``, ``map50`` and ``map50_95``."""

    name: str
    images: int
    instances: int
    p: float
    r: float
    map50: float
    map50_95: float

    def to_dict(self) -> dict:
        return {"class": self.name, "images": self.images, "instances": self.instances,
                "precision": self.p, "recall": self.r, "mAP50": self.map50,
                "mAP50-95": self.map50_95}


@dataclass
class DetectionResults:
    """Overall and per-class metrics (ultralytics' ``DetMetrics``): ``all`` averages the classes
    that have labels; ``fitness`` is ultralytics' model-selection score (mAP50-95)."""

    all: ClassResult
    classes: list[ClassResult] = field(default_factory=list)
    ap: APResult | None = None

    @property
    def fitness(self) -> float:
        return self.all.map50_95

    def to_dict(self) -> dict:
        return {"all": self.all.to_dict(), "classes": [c.to_dict() for c in self.classes],
                "fitness": self.fitness}

    def table(self) -> str:
        """ultralytics' validation printout: a header, ``all``, then one line per class."""
        head = ("%22s" + "%11s" * 6) % ("Class", "Images", "Instances", "Box(P", "R", "mAP50",
                                         "mAP50-95)")
        row = "%22s" + "%11i" * 2 + "%11.3g" * 4
        lines = [head] + [row % (printable(c.name), c.images, c.instances, c.p, c.r, c.map50,
                                 c.map50_95) for c in [self.all, *self.classes]]
        return "\n".join(lines)


class DetectionMetrics:
    """Accumulates images as ultralytics' ``DetectionValidator`` does and computes
    :class:`DetectionResults`.

    Args:
        names: class names (index = class id).
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self._tp: list[np.ndarray] = []
        self._conf: list[np.ndarray] = []
        self._pred_cls: list[np.ndarray] = []
        self._target_cls: list[np.ndarray] = []
        self._target_img: list[np.ndarray] = []
        self.seen = 0

    def update(self, pred_boxes: np.ndarray, pred_conf: np.ndarray, pred_cls: np.ndarray,
               gt_boxes: np.ndarray, gt_cls: np.ndarray) -> None:
        """Add one image: detections ``(D, 4)`` xyxy, ``(D,)`` scores and classes (best first, as
        non-maximum suppression returns them) and its ground truth ``(L, 4)``, ``(L,)``, the boxes
        in the same units."""
        pred_conf = np.asarray(pred_conf, dtype=np.float32).reshape(-1)
        pred_cls = np.asarray(pred_cls).reshape(-1)
        gt_cls = np.asarray(gt_cls).reshape(-1)
        n_t = len(IOU_THRESHOLDS)
        if len(gt_cls) and len(pred_cls):
            iou = box_iou(gt_boxes, pred_boxes)
            tp = match_predictions(pred_cls, gt_cls, iou)
        else:
            tp = np.zeros((len(pred_cls), n_t), dtype=bool)
        self.seen += 1
        self._tp.append(tp)
        self._conf.append(pred_conf)
        self._pred_cls.append(pred_cls)
        self._target_cls.append(gt_cls)
        self._target_img.append(np.unique(gt_cls))

    def results(self) -> DetectionResults:
        nc = len(self.names)
        tp = np.concatenate(self._tp) if self._tp else np.zeros((0, len(IOU_THRESHOLDS)), bool)
        target_cls = _concat(self._target_cls, np.int64)
        res = ap_per_class(tp, _concat(self._conf, np.float32), _concat(self._pred_cls, np.int64),
                           target_cls)
        per_class = np.bincount(target_cls, minlength=nc)
        per_image = np.bincount(_concat(self._target_img, np.int64), minlength=nc)
        overall = ClassResult("all", self.seen, int(per_class.sum()), _mean(res.p), _mean(res.r),
                              _mean(res.ap[:, 0]), _mean(res.ap))
        rows = [ClassResult(self.names[c] if c < nc else str(c), int(per_image[c]),
                            int(per_class[c]), float(res.p[i]), float(res.r[i]),
                            float(res.ap[i, 0]), float(res.ap[i].mean()))
                for i, c in enumerate(res.classes)]
        return DetectionResults(overall, rows, res)


def _concat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else 0.0
