"""Detection metrics against ultralytics' published algorithm, re-done here one detection and one
recall point at a time (plain Python loops, float64): the validator's greedy matching at IoU
0.50:0.95 (``match_predictions``), ``ap_per_class`` (101-point interpolated AP of the precision
envelope; P and R at the best smoothed mean F1) and ``DetMetrics``' means, on seeded random sets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from candle_nn_models.yolo_v8_metrics import (
    IOU_THRESHOLDS, DetectionMetrics, ap_per_class, box_iou, match_predictions,
)


def _random_set(seed: int, images: int = 25, nc: int = 4):
    """Per image: ground truth (class ``nc - 1`` never labelled) and detections: jittered copies
    of most boxes (some with a wrong class) plus random boxes, best first."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(images):
        n = int(rng.integers(0, 6))
        xy = rng.uniform(0, 400, (n, 2))
        gt = np.concatenate([xy, xy + rng.uniform(8, 120, (n, 2))], axis=1).astype(np.float32)
        gt_cls = rng.integers(0, nc - 1, n)
        hit = rng.random(n) < 0.8
        boxes = gt[hit] + rng.normal(0, 6, (hit.sum(), 4))
        cls = np.where(rng.random(hit.sum()) < 0.85, gt_cls[hit], rng.integers(0, nc, hit.sum()))
        extra = int(rng.integers(0, 4))
        exy = rng.uniform(0, 400, (extra, 2))
        boxes = np.concatenate([boxes, np.concatenate([exy, exy + 40], 1)]).astype(np.float32)
        cls = np.concatenate([cls, rng.integers(0, nc, extra)])
        conf = np.round(rng.random(len(boxes)), 2).astype(np.float32)  # ties included
        order = np.argsort(-conf, kind="stable")
        out.append((boxes[order], conf[order], cls[order], gt, gt_cls))
    return out


def _ref_iou(a, b) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter + 1e-7)


def _ref_match(boxes, cls, gt, gt_cls) -> np.ndarray:
    correct = np.zeros((len(boxes), 10), dtype=bool)
    for t, threshold in enumerate(IOU_THRESHOLDS.astype(np.float64)):
        claimed = set()
        for j in range(len(boxes)):  # best first
            best, best_iou = None, 0.0
            for i in range(len(gt)):
                if i in claimed or gt_cls[i] != cls[j]:
                    continue
                iou = _ref_iou(gt[i].astype(np.float64), boxes[j].astype(np.float64))
                if iou > best_iou:
                    best, best_iou = i, iou
            if best is not None and best_iou >= threshold:
                correct[j, t] = True
                claimed.add(best)
    return correct


def _ref_interp(x: float, xs: list[float], ys: list[float], left: float | None = None) -> float:
    """np.interp at one point: linear between the last ``xs[k] <= x`` and the next."""
    if x < xs[0]:
        return ys[0] if left is None else left
    k = max(i for i in range(len(xs)) if xs[i] <= x)
    if k == len(xs) - 1:
        return ys[-1]
    return ys[k] + (ys[k + 1] - ys[k]) * (x - xs[k]) / (xs[k + 1] - xs[k])


def _ref_ap(recall: list[float], precision: list[float]) -> float:
    mrec = [0.0, *recall, recall[-1], 1.0]
    mpre = [1.0, *precision, 0.0, 0.0]
    for k in range(len(mpre) - 2, -1, -1):  # the envelope: best precision at this recall or more
        mpre[k] = max(mpre[k], mpre[k + 1])
    points = [k / 100 for k in range(101)]
    values = [_ref_interp(x, mrec, mpre) for x in points]
    return sum((values[k] + values[k + 1]) / 2 * 0.01 for k in range(100))


def _ref_metrics(data, nc: int):
    """``(per class {c: (p, r, ap50, ap50_95)}, overall (p, r, map50, map50_95))``."""
    tp = np.concatenate([_ref_match(b, c, g, gc) for b, _, c, g, gc in data])
    conf = np.concatenate([d[1] for d in data]).astype(np.float64)
    pred_cls = np.concatenate([d[2] for d in data])
    target_cls = np.concatenate([d[4] for d in data])
    order = np.argsort(-conf.astype(np.float32))  # the set's order (ultralytics' sort)
    tp, conf, pred_cls = tp[order], conf[order], pred_cls[order]
    xs = [k / 999 for k in range(1000)]
    classes = sorted(set(target_cls.tolist()))
    p_curves, r_curves, aps = [], [], []
    for c in classes:
        n_labels = int((target_cls == c).sum())
        idx = [k for k in range(len(conf)) if pred_cls[k] == c]
        if not idx:
            p_curves.append([0.0] * 1000)
            r_curves.append([0.0] * 1000)
            aps.append([0.0] * 10)
            continue
        ap_row = []
        for t in range(10):
            hits = np.cumsum([tp[k, t] for k in idx])
            recall = [h / (n_labels + 1e-16) for h in hits]
            precision = [h / (m + 1) for m, h in enumerate(hits)]
            ap_row.append(_ref_ap(recall, precision))
            if t == 0:
                negc = [-conf[k] for k in idx]
                r_curves.append([_ref_interp(-x, negc, recall, left=0.0) for x in xs])
                p_curves.append([_ref_interp(-x, negc, precision, left=1.0) for x in xs])
        aps.append(ap_row)
    p_curves, r_curves = np.array(p_curves), np.array(r_curves)
    f1 = 2 * p_curves * r_curves / (p_curves + r_curves + 1e-16)
    mean_f1 = f1.mean(axis=0)
    width = 101  # round(1000 * 0.1 * 2) // 2 + 1
    padded = [mean_f1[0]] * 50 + list(mean_f1) + [mean_f1[-1]] * 50
    smoothed = [sum(padded[k:k + width]) / width for k in range(1000)]
    best = int(np.argmax(smoothed))
    aps = np.array(aps)
    per_class = {c: (p_curves[i, best], r_curves[i, best], aps[i, 0], aps[i].mean())
                 for i, c in enumerate(classes)}
    overall = (p_curves[:, best].mean(), r_curves[:, best].mean(), aps[:, 0].mean(), aps.mean())
    return per_class, overall


@pytest.mark.parametrize("seed", [0, 1])
def test_metrics_match_ultralytics_algorithm(seed) -> None:
    nc = 4
    data = _random_set(seed, nc=nc)
    metrics = DetectionMetrics([f"class{i}" for i in range(nc)])
    for image in data:
        metrics.update(*image)
    res = metrics.results()
    ref_classes, ref_all = _ref_metrics(data, nc)
    assert [c.name for c in res.classes] == [f"class{c}" for c in ref_classes]
    for row, (c, ref) in zip(res.classes, ref_classes.items()):
        np.testing.assert_allclose([row.p, row.r, row.map50, row.map50_95], ref, atol=1e-9,
                                   err_msg=f"class {c}")
    got_all = [res.all.p, res.all.r, res.all.map50, res.all.map50_95]
    np.testing.assert_allclose(got_all, ref_all, atol=1e-9)
    assert 0.05 < res.all.map50 < 0.95  # a set where the metrics discriminate
    labels = np.concatenate([d[4] for d in data])
    assert res.all.instances == len(labels) and res.all.images == len(data)
    for row, c in zip(res.classes, ref_classes):
        assert row.instances == (labels == c).sum()
        assert row.images == sum((d[4] == c).any() for d in data)


def test_matching_matches_the_greedy_rule() -> None:
    for boxes, conf, cls, gt, gt_cls in _random_set(2, images=10):
        if len(gt) and len(boxes):
            got = match_predictions(cls, gt_cls, box_iou(gt, boxes))
            assert np.array_equal(got, _ref_match(boxes, cls, gt, gt_cls))


def test_perfect_and_empty_sets() -> None:
    gt = np.array([[0, 0, 10, 10], [20, 20, 40, 50]], np.float32)
    metrics = DetectionMetrics(["a", "b"])
    metrics.update(gt, [0.9, 0.8], [0, 1], gt, [0, 1])
    res = metrics.results()
    assert (res.all.p, res.all.r) == pytest.approx((1, 1))
    # ultralytics' perfect score: the envelope drops to 0 at recall 1 (the sentinel), so the last
    # of the 100 trapezoids is half
    assert (res.all.map50, res.all.map50_95) == pytest.approx((0.995, 0.995), abs=1e-9)
    empty = DetectionMetrics(["a"])
    empty.update(np.zeros((0, 4)), [], [], np.zeros((0, 4)), [])
    assert empty.results().all.map50 == 0.0 and empty.results().classes == []
    missed = DetectionMetrics(["a", "b"])
    missed.update(np.zeros((0, 4)), [], [], gt, [0, 1])  # nothing detected
    assert [c.map50 for c in missed.results().classes] == [0.0, 0.0]


def test_ap_per_class_ignores_unlabelled_classes() -> None:
    tp = np.ones((3, 10), bool)
    res = ap_per_class(tp, np.array([0.9, 0.8, 0.7]), np.array([0, 5, 5]), np.array([0]))
    assert res.classes.tolist() == [0] and res.ap.shape == (1, 10)


def test_results_as_json_and_table() -> None:
    metrics = DetectionMetrics(["cat", "dog"])
    for image in _random_set(3, images=6, nc=2):
        metrics.update(*image)
    res = metrics.results()
    data = json.loads(json.dumps(res.to_dict()))
    assert set(data) == {"all", "classes", "fitness"}
    assert set(data["all"]) == {"class", "images", "instances", "precision", "recall", "mAP50",
                                "mAP50-95"}
    assert data["fitness"] == res.all.map50_95
    lines = res.table().splitlines()
    assert lines[0].split() == ["Class", "Images", "Instances", "Box(P", "R", "mAP50", "mAP50-95)"]
    assert lines[1].split()[0] == "all" and len(lines) == 2 + len(res.classes)


def _ultralytics_metrics(data, nc: int):
    """ultralytics 8.4's own validator matching (``DetectionValidator.match_predictions`` with its
    ``box_iou``, as ``_process_batch`` calls them) and ``DetMetrics`` on the same detections."""
    from types import SimpleNamespace

    import torch

    from helpers.ultralytics_reference import import_ultralytics

    import_ultralytics()
    from ultralytics.models.yolo.detect.val import DetectionValidator
    from ultralytics.utils.metrics import DetMetrics, box_iou as u_box_iou

    validator = SimpleNamespace(iouv=torch.linspace(0.5, 0.95, 10))
    metrics = DetMetrics(names={i: f"class{i}" for i in range(nc)})
    for k, (boxes, conf, cls, gt, gt_cls) in enumerate(data):
        if len(gt) and len(boxes):
            iou = u_box_iou(torch.from_numpy(gt), torch.from_numpy(boxes))
            tp = DetectionValidator.match_predictions(validator, torch.from_numpy(cls),
                                                      torch.from_numpy(gt_cls), iou).numpy()
        else:
            tp = np.zeros((len(boxes), 10), bool)
        metrics.update_stats({"tp": tp, "conf": conf, "pred_cls": cls, "target_cls": gt_cls,
                              "target_img": np.unique(gt_cls), "im_name": f"im{k}"})
    metrics.process()
    return metrics


@pytest.mark.parametrize("seed", [0, 1, 4])
def test_metrics_equal_ultralytics_detmetrics(seed) -> None:
    nc = 4
    data = _random_set(seed, images=40, nc=nc)
    ours = DetectionMetrics([f"class{i}" for i in range(nc)])
    for image in data:
        ours.update(*image)
    res = ours.results()
    want = _ultralytics_metrics(data, nc)
    assert [c.name for c in res.classes] == [f"class{i}" for i in want.ap_class_index]
    for i, row in enumerate(res.classes):
        np.testing.assert_allclose([row.p, row.r, row.map50, row.map50_95],
                                   want.class_result(i), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose([res.all.p, res.all.r, res.all.map50, res.all.map50_95],
                               want.mean_results(), rtol=1e-12, atol=1e-12)
    assert res.fitness == pytest.approx(want.fitness, abs=1e-12)
    assert [c.instances for c in res.classes] == [int(want.nt_per_class[i])
                                                  for i in want.ap_class_index]
    assert [c.images for c in res.classes] == [int(want.nt_per_image[i])
                                               for i in want.ap_class_index]
    assert 0.05 < res.all.map50 < 0.95
