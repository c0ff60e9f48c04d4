"""YOLOv8 pre/post-processing: letterbox against the fixture's input, NMS against hand-made cases
and plain reference loops, and the mapping of boxes/keypoints back to the original image."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_fixture
from helpers.nms_reference import random_boxes, reference_nms

from candle_nn_models.letterbox import Letterbox, letterbox, resize_bilinear
from candle_nn_models.yolo_v8_post import (box_iou_one, non_max_suppression, postprocess,
                                           xywh_to_xyxy)

# --- letterbox -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["yolov8n", "yolov8n_pose"])
def test_letterbox_reproduces_the_fixture_input(name) -> None:
    io, meta, _ = load_fixture(name)
    lb = letterbox(io["input.raw_rgb"], tuple(meta["letterbox"]["input_hw"]), auto=False)
    assert lb.scale == pytest.approx(meta["letterbox"]["scale"])
    assert lb.orig_hw == tuple(meta["letterbox"]["orig_hw"])
    assert lb.pad == (0, 97)  # 556 * 0.8 = 444.8 -> 445 rows; 195 of padding: 97 above, 98 below
    x = lb.as_input()
    ref = io["input.image"].transpose(0, 2, 3, 1)
    assert x.shape == ref.shape and x.dtype == np.float32
    # The resize reproduces OpenCV's fixed-point INTER_LINEAR: every pixel equal (measured 0;
    # a float bilinear resize is one grey level off on 8.6% of them, PIL's antialiased one 44).
    np.testing.assert_array_equal(x, ref)


def test_letterbox_rect_mode_pads_to_the_next_multiple_of_the_stride() -> None:
    image = np.zeros((556, 800, 3), np.uint8)
    lb = letterbox(image, 640, auto=True)
    assert lb.image.shape == (448, 640, 3)  # 445 rows + 3 of padding: 1 above, 2 below
    assert lb.pad == (0, 1)
    tall = letterbox(np.zeros((1000, 300, 3), np.uint8), 640, auto=True)
    assert tall.image.shape == (640, 192, 3) and tall.pad == (0, 0)  # 300 * 0.64 = 192 = 6 * 32
    odd = letterbox(np.zeros((1000, 310, 3), np.uint8), 640, auto=True)
    assert odd.image.shape == (640, 224, 3) and odd.pad == (13, 0)  # 198 wide + 26: 13 / 13


def test_letterbox_rectangular_target_and_no_scaleup() -> None:
    image = np.full((100, 50, 3), 7, np.uint8)
    lb = letterbox(image, (384, 640))
    assert lb.image.shape == (384, 640, 3) and lb.scale == pytest.approx(3.84)
    assert lb.pad == (224, 0)  # 50 * 3.84 = 192 wide; 448 columns of padding split 224 / 224
    assert (lb.image[:, :224] == 114).all() and (lb.image[:, 224:416] == 7).all()
    small = letterbox(image, 640, scaleup=False)
    assert small.scale == 1.0 and small.image.shape == (640, 640, 3)
    assert (small.image[270:370, 295:345] == 7).all()


def test_resize_is_opencv_linear() -> None:
    ramp = np.arange(8, dtype=np.uint8).repeat(3).reshape(1, 8, 3) * 30
    # Halving with half-pixel centres averages neighbour pairs (no antialiasing filter).
    half = resize_bilinear(np.repeat(ramp, 2, axis=0), 2, 4)
    np.testing.assert_array_equal(half[0, :, 0], [15, 75, 135, 195])
    # Doubling: edges replicate, inner pixels blend 3:1 (7.5 and 22.5 round up, as OpenCV).
    double = resize_bilinear(ramp[:, :2], 1, 4)
    np.testing.assert_array_equal(double[0, :, 0], [0, 8, 23, 30])
    flat = np.full((37, 53, 3), 200, np.uint8)
    assert (resize_bilinear(flat, 91, 17) == 200).all()
    assert resize_bilinear(flat, 37, 53) is not flat


def test_to_original_inverts_the_letterbox_and_clips() -> None:
    lb = Letterbox(np.zeros((640, 640, 3), np.uint8), 0.8, (0, 97), (556, 800))
    # the image fills round(556 * 0.8) = 445 rows: ultralytics' scale_boxes maps each axis by its
    # own rounded size (gain_y = 445 / 556), not by the ratio 0.8
    assert lb.gains == (640 / 800, 445 / 556)
    pts = np.array([[0.0, 97.0, 640.0, 97.0 + 445], [-5.0, 10.0, 700.0, 600.0]])
    out = lb.to_original(pts)
    np.testing.assert_allclose(out[0], [0, 0, 800, 556], atol=1e-3)
    np.testing.assert_allclose(out[1], [0, 0, 800, 556])  # clipped to the image


# --- NMS -----------------------------------------------------------------------------------


def matrix_nms(boxes, scores, iou_threshold, classes) -> list[int]:
    """The same with the full IoU matrix in NumPy and one loop over the sorted boxes."""
    order = np.argsort(-scores, kind="stable")
    b, c = boxes[order], classes[order]
    lt = np.maximum(b[:, None, :2], b[None, :, :2])
    rb = np.minimum(b[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=-1)
    area = np.prod(b[:, 2:] - b[:, :2], axis=-1)
    iou = inter / (area[:, None] + area[None, :] - inter)
    over = (iou > iou_threshold) & (c[:, None] == c[None, :])
    alive = np.ones(len(b), bool)
    for i in range(len(b)):
        if alive[i]:
            alive[i + 1:] &= ~over[i, i + 1:]
    return order[alive].tolist()


def test_nms_same_class_overlap_keeps_the_best() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]], np.float32)
    scores = np.array([0.8, 0.9, 0.7])
    assert non_max_suppression(boxes, scores, 0.5, np.zeros(3)).tolist() == [1, 2]


def test_nms_different_classes_do_not_suppress() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11]], np.float32)
    scores = np.array([0.8, 0.9])
    assert non_max_suppression(boxes, scores, 0.5, np.array([0, 1])).tolist() == [1, 0]
    assert non_max_suppression(boxes, scores, 0.5).tolist() == [1]  # class-agnostic


def test_nms_ties_keep_input_order() -> None:
    boxes = np.array([[0, 0, 10, 10]] * 3 + [[100, 100, 110, 110]], np.float32)
    scores = np.array([0.5, 0.5, 0.5, 0.5])
    assert non_max_suppression(boxes, scores, 0.5, np.zeros(4)).tolist() == [0, 3]


def test_nms_threshold_is_strict_and_greedy() -> None:
    # IoU(a, b) = 50 / 150 = 1/3 exactly: not above a 1/3 threshold, so both stay.
    a, b = [0, 0, 10, 10], [5, 0, 15, 10]
    assert box_iou_one(np.array(a, float), np.array([b], float))[0] == pytest.approx(1 / 3)
    keep = non_max_suppression(np.array([a, b], float), np.array([0.9, 0.8]), 1 / 3)
    assert keep.tolist() == [0, 1]
    # A chain: a suppresses b, b would have suppressed c, but b is gone, so c stays.
    boxes = np.array([[0, 0, 10, 10], [4, 0, 14, 10], [8, 0, 18, 10]], float)
    assert non_max_suppression(boxes, np.array([0.9, 0.8, 0.7]), 0.4).tolist() == [0, 2]


def test_nms_empty_and_degenerate() -> None:
    assert non_max_suppression(np.zeros((0, 4)), np.zeros(0), 0.5).tolist() == []
    # A zero-area box never overlaps anything (NaN IoU), not even an identical one.
    boxes = np.array([[5, 5, 5, 5], [5, 5, 5, 5]], float)
    assert non_max_suppression(boxes, np.array([0.9, 0.8]), 0.5).tolist() == [0, 1]
    with pytest.raises(ValueError):
        non_max_suppression(np.zeros((2, 4)), np.zeros(3), 0.5)


def test_nms_matches_plain_python_loops() -> None:
    boxes, scores, classes = random_boxes(600, 3, seed=0)
    for thr in (0.3, 0.45, 0.7):
        got = non_max_suppression(boxes, scores, thr, classes).tolist()
        assert got == reference_nms(boxes.tolist(), scores.tolist(), thr, classes.tolist())


def test_nms_thousands_of_candidates() -> None:
    boxes, scores, classes = random_boxes(3000, 4, seed=1)
    got = non_max_suppression(boxes, scores, 0.45, classes)
    expected = matrix_nms(boxes, scores, 0.45, classes)
    assert got.tolist() == expected
    assert 50 < len(got) < 3000
    assert non_max_suppression(boxes, scores, 0.45, classes, max_det=100).tolist() == expected[:100]


# --- postprocess ---------------------------------------------------------------------------


def _pred(rows: list[list[float]]) -> np.ndarray:
    """``(1, C, A)`` from anchor rows."""
    return np.asarray(rows, np.float32).T[None]


def test_postprocess_filters_sorts_and_maps_back() -> None:
    lb = Letterbox(np.zeros((640, 640, 3), np.uint8), 0.5, (0, 20), (1200, 1280))
    #               cx   cy   w   h   c0    c1
    pred = _pred([[100, 120, 40, 40, 0.90, 0.10],   # kept: class 0
                  [102, 121, 40, 40, 0.80, 0.05],   # overlaps the first, same class: dropped
                  [101, 120, 40, 40, 0.10, 0.60],   # overlaps, other class: kept
                  [600, 600, 100, 100, 0.30, 0.25],  # kept, clipped at the image's bottom-right
                  [300, 300, 10, 10, 0.25, 0.20]])  # score not above conf: dropped
    dets = postprocess(pred, [lb], num_classes=2, conf=0.25, iou=0.45)[0]
    assert [(d.class_id, round(d.score, 2)) for d in dets] == [(0, 0.9), (1, 0.6), (0, 0.3)]
    np.testing.assert_allclose(dets[0].box_xyxy, [160, 160, 240, 240])  # (x - 0, y - 20) / 0.5
    np.testing.assert_allclose(dets[2].box_xyxy, [1100, 1060, 1280, 1200])
    assert all(d.keypoints is None for d in dets)
    assert postprocess(pred, [lb], num_classes=2, conf=0.95)[0] == []
    agnostic = postprocess(pred, [lb], num_classes=2, conf=0.25, iou=0.45, agnostic=True)[0]
    assert [(d.class_id, round(d.score, 2)) for d in agnostic] == [(0, 0.9), (0, 0.3)]


def test_postprocess_default_iou_is_ultralytics() -> None:
    """Left out, the NMS threshold is ultralytics' (and ``YOLO.predict``'s) 0.7: two boxes of one
    class overlapping with IoU 2/3 both stay; at 0.45 the weaker is suppressed."""
    from candle_nn_models.yolo import PredictOptions

    lb = Letterbox(np.zeros((64, 64, 3), np.uint8), 1.0, (0, 0), (200, 200))
    pred = _pred([[100, 100, 40, 40, 0.9],
                  [108, 100, 40, 40, 0.8]])  # IoU (32 * 40) / (2 * 1600 - 32 * 40) = 2/3
    boxes = xywh_to_xyxy(pred[0, :4].T)
    assert box_iou_one(boxes[0], boxes[1:])[0] == pytest.approx(2 / 3)
    assert [d.score for d in postprocess(pred, [lb], num_classes=1)[0]] == pytest.approx([0.9, 0.8])
    assert len(postprocess(pred, [lb], num_classes=1, iou=0.45)[0]) == 1
    assert PredictOptions().iou == 0.7


def test_postprocess_keypoints_and_json() -> None:
    lb = Letterbox(np.zeros((64, 64, 3), np.uint8), 2.0, (4, 0), (32, 30))
    pred = _pred([[20, 20, 8, 8, 0.9, 14, 10, 0.95, 200, -3, 0.1]])
    (det,) = postprocess(pred, [lb], num_classes=1, num_keypoints=2)[0]
    np.testing.assert_allclose(det.keypoints, [[5, 5, 0.95], [30, 0, 0.1]])
    out = det.to_dict(["person"])
    assert out == {"class_id": 0, "class_name": "person", "score": 0.9,
                   "box_xyxy": [6.0, 8.0, 10.0, 12.0],
                   "keypoints": [[5.0, 5.0, 0.95], [30.0, 0.0, 0.1]]}


def test_postprocess_batches_and_checks_shapes() -> None:
    lb = Letterbox(np.zeros((64, 64, 3), np.uint8), 1.0, (0, 0), (64, 64))
    pred = np.concatenate([_pred([[10, 10, 4, 4, 0.9]]), _pred([[10, 10, 4, 4, 0.1]])])
    assert [len(d) for d in postprocess(pred, [lb, lb], num_classes=1)] == [1, 0]
    with pytest.raises(ValueError, match="letterboxed"):
        postprocess(pred, [lb], num_classes=1)
    with pytest.raises(ValueError, match="channels"):
        postprocess(pred, [lb, lb], num_classes=2)


def test_xywh_to_xyxy() -> None:
    np.testing.assert_array_equal(xywh_to_xyxy(np.array([[10.0, 20, 4, 6]])), [[8, 17, 12, 23]])
