"""From YOLOv8's raw prediction to detections, as ultralytics' ``non_max_suppression``.

Per image: keep anchors whose best class score exceeds ``conf`` (and, with ``classes``, whose best
class is one of them), sort by that score, run greedy class-aware NMS (a box is dropped when its IoU
with a kept box of the same class exceeds ``iou``), keep at most ``max_det``, and map boxes (and
keypoints) back to the original image with the :class:`~candle_nn_models.letterbox.Letterbox` that
made the input. Everything here runs in NumPy on the host, after the model.

Also here, ultralytics' output formats for detections: :func:`yolo_label_lines` (``--save-txt``'s
YOLO label lines) and :func:`crop_box` (``--save-crop``'s crop rectangle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from candle_nn import ShapeMismatchError
import numpy as np

from .letterbox import Letterbox


@dataclass
class Detection:
    """One detected object, in original-image pixels.

    Attributes:
        box_xyxy: ``(4,)`` float32 ``x1, y1, x2, y2``.
        score: the class score (sigmoid), in [0, 1].
        class_id: index into the class names.
        keypoints: pose models only: ``(K, 3)`` float32 ``x, y, visibility``.
        mask_coefficients, input_box_xyxy: segmentation models only: the raw ``(num_masks,)``
            coefficients and the box in model-input pixels, which make the mask.
        mask: segmentation models only, after ``segment_postprocess``: ``(H, W)`` bool on the
            original image.
    """

    box_xyxy: np.ndarray
    score: float
    class_id: int
    keypoints: np.ndarray | None = field(default=None)
    mask_coefficients: np.ndarray | None = field(default=None, repr=False)
    input_box_xyxy: np.ndarray | None = field(default=None, repr=False)
    mask: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self, names: Sequence[str] | None = None) -> dict:
        """JSON-ready: ``class_id``, ``class_name`` (when ``names``), ``score``, ``box_xyxy``,
        ``keypoints`` (pose only) and ``segmentation`` (with a mask: its COCO RLE on the
        original image), rounded to 0.01 pixel / 1e-4."""
        out = {"class_id": self.class_id}
        if names is not None:
            known = self.class_id < len(names)
            out["class_name"] = names[self.class_id] if known else str(self.class_id)
        out["score"] = round(float(self.score), 4)
        out["box_xyxy"] = [round(float(v), 2) for v in self.box_xyxy]
        if self.keypoints is not None:
            out["keypoints"] = [[round(float(x), 2), round(float(y), 2), round(float(v), 4)]
                                for x, y, v in self.keypoints]
        if self.mask is not None:
            out["segmentation"] = coco_rle(self.mask)
        return out


def xywh_to_xyxy(xywh: np.ndarray) -> np.ndarray:
    """``(..., 4)`` centre x, y, width, height → corners x1, y1, x2, y2."""
    xy, half = xywh[..., :2], xywh[..., 2:4] / 2
    return np.concatenate([xy - half, xy + half], axis=-1)


def box_iou_one(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one ``(4,)`` xyxy box with ``(M, 4)`` boxes, as torchvision (areas ``(x2-x1)(y2-y1)``;
    a zero union gives NaN, which never counts as an overlap)."""
    wh = np.clip(np.minimum(box[2:], boxes[:, 2:]) - np.maximum(box[:2], boxes[:, :2]), 0, None)
    inter = wh[:, 0] * wh[:, 1]
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    with np.errstate(divide="ignore", invalid="ignore"):
        return inter / (area + areas - inter)


def _greedy(boxes: np.ndarray, order: np.ndarray, iou_threshold: float,
            max_det: int | None) -> list[int]:
    """Greedy suppression over ``order`` (indices, best first), all boxes competing."""
    keep: list[int] = []
    while order.size and (max_det is None or len(keep) < max_det):
        best, order = order[0], order[1:]
        keep.append(int(best))
        order = order[~(box_iou_one(boxes[best], boxes[order]) > iou_threshold)]
    return keep


def non_max_suppression(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float,
                        class_ids: np.ndarray | None = None,
                        max_det: int | None = None) -> np.ndarray:
    """Greedy NMS; returns the indices of the kept boxes, best score first.

    Args:
        boxes: ``(M, 4)`` xyxy. scores: ``(M,)``.
        iou_threshold: a box is suppressed when its IoU with a kept box is *above* this.
        class_ids: ``(M,)``; when given, only boxes of the same class suppress each other.
        max_det: keep at most this many (the same result as truncating afterwards).

    Equal scores keep their input order (stable sort). Each step compares the current best box
    with all remaining ones of its class at once: the cost is (kept) × (candidates of the class).
    """
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    scores = np.asarray(scores).reshape(-1)
    if len(boxes) != len(scores):
        raise ValueError(f"{len(boxes)} boxes but {len(scores)} scores")
    order = np.argsort(-scores, kind="stable")
    if class_ids is None:
        return np.asarray(_greedy(boxes, order, iou_threshold, max_det), dtype=np.intp)
    # Classes never suppress each other: run each class alone, then merge by rank.
    classes = np.asarray(class_ids).reshape(-1)[order]
    ranks = np.empty(len(order), dtype=np.intp)
    ranks[order] = np.arange(len(order))
    keep = [i for c in np.unique(classes)
            for i in _greedy(boxes, order[classes == c], iou_threshold, max_det)]
    keep = np.asarray(sorted(keep, key=ranks.__getitem__), dtype=np.intp)
    return keep if max_det is None else keep[:max_det]


MAX_NMS = 30000  # ultralytics' cap on the candidates entering NMS


def validation_detections(pred: np.ndarray, num_classes: int, conf: float = 0.001,
                          iou: float = 0.7, max_det: int = 300,
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ultralytics' validation NMS on one image's ``(4 + nc, A)`` prediction: every (anchor,
    class) scoring above ``conf`` is a candidate, the best ``MAX_NMS`` enter class-aware NMS.
    Returns ``(boxes (D, 4) xyxy input pixels, scores (D,), classes (D,))``, best first."""
    scores = pred[4:4 + num_classes].T  # (A, nc)
    anchor, cls = np.nonzero(scores > conf)
    score = scores[anchor, cls]
    order = np.argsort(-score, kind="stable")[:MAX_NMS]
    anchor, cls, score = anchor[order], cls[order], score[order]
    boxes = xywh_to_xyxy(pred[:4, anchor].T)
    keep = non_max_suppression(boxes, score, iou, class_ids=cls, max_det=max_det)
    return boxes[keep], score[keep], cls[keep]


def postprocess(pred, letterboxes: Sequence[Letterbox], *, num_classes: int,
                num_keypoints: int = 0, num_masks: int = 0, conf: float = 0.25, iou: float = 0.7,
                max_det: int = 300, max_nms: int = 30000, agnostic: bool = False,
                classes: Sequence[int] | None = None) -> list[list[Detection]]:
    """Detections per image from a raw prediction.

    Args:
        pred: ``(N, 4 + num_classes + 3 * num_keypoints + num_masks, A)`` (``mx.array`` or
            NumPy), the model's output for ``N`` letterboxed images.
        letterboxes: the ``N`` letterboxes that made the inputs (to map back to the originals).
        num_classes, num_keypoints, num_masks: the model's (``YoloV8Spec``'s; 0 keypoints and
            masks for a detector). Segmentation: each detection keeps its mask coefficients
            (``candle_nn_models.yolo_v8_masks.segment_postprocess`` makes the masks).
            They must account for every channel of ``pred``: an 80-class prediction read with
            ``num_classes=2`` is refused, not split into 2 classes and 26 "keypoints".
        conf: minimum class score (strictly above). iou: NMS IoU threshold (ultralytics' 0.7).
        max_det: detections kept per image. max_nms: best candidates entering NMS.
        agnostic: boxes of different classes suppress each other too.
        classes: keep only anchors whose best class is one of these (ultralytics' ``classes``:
            filtered after the ``conf`` test, before NMS).
    """
    if isinstance(pred, (list, tuple)):
        raise ShapeMismatchError(
            f"pred is a list of {len(pred)} arrays, a train-mode model's raw per-level maps: "
            "call model.eval() to get its (N, channels, anchors) prediction")
    pred = np.asarray(pred, dtype=np.float32)
    if pred.ndim != 3 or len(pred) != len(letterboxes):
        raise ShapeMismatchError(
            f"pred of shape {pred.shape} for {len(letterboxes)} letterboxed images: pass the "
            "model's (N, channels, anchors) output and one letterbox per image")
    want = 4 + num_classes + 3 * num_keypoints + num_masks
    if num_classes < 1 or num_keypoints < 0 or num_masks < 0 or pred.shape[1] != want:
        keypoints = f" + 3 x {num_keypoints} keypoints" if num_keypoints else ""
        keypoints += f" + {num_masks} mask coefficients" if num_masks else ""
        raise ShapeMismatchError(
            f"pred has {pred.shape[1]} channels, not 4 + {num_classes} classes{keypoints} = "
            f"{want}: pass the model's own num_classes and num_keypoints (its YoloV8Spec, e.g. "
            "infer_spec(vb)); a detector's are 4 + num_classes")
    wanted = None if classes is None else np.asarray(sorted(set(classes)), dtype=np.intp)
    return [_one_image(p.T, lb, num_classes, num_keypoints, num_masks, conf, iou, max_det,
                       max_nms, agnostic, wanted) for p, lb in zip(pred, letterboxes)]


def _one_image(x: np.ndarray, lb: Letterbox, nc: int, nk: int, nm: int, conf: float, iou: float,
               max_det: int, max_nms: int, agnostic: bool,
               classes: np.ndarray | None) -> list[Detection]:
    cls = x[:, 4:4 + nc]
    class_ids = cls.argmax(axis=1)
    scores = cls[np.arange(len(x)), class_ids]
    candidates = np.flatnonzero(scores > conf)
    if classes is not None:
        candidates = candidates[np.isin(class_ids[candidates], classes)]
    candidates = candidates[np.argsort(-scores[candidates], kind="stable")[:max_nms]]
    boxes = xywh_to_xyxy(x[candidates, :4])
    groups = None if agnostic else class_ids[candidates]
    kept = candidates[non_max_suppression(boxes, scores[candidates], iou, groups, max_det)]
    if not kept.size:
        return []
    in_boxes = xywh_to_xyxy(x[kept, :4])
    out_boxes = lb.to_original(in_boxes)
    kpts = None
    if nk:
        kpts = x[kept, 4 + nc:4 + nc + 3 * nk].reshape(-1, nk, 3).copy()
        kpts[..., :2] = lb.to_original(kpts[..., :2])
    coefficients = x[kept, 4 + nc + 3 * nk:] if nm else None
    return [Detection(out_boxes[i], float(scores[k]), int(class_ids[k]),
                      None if kpts is None else kpts[i],
                      None if coefficients is None else coefficients[i],
                      in_boxes[i] if nm else None) for i, k in enumerate(kept)]


KEYPOINT_MIN_VISIBILITY = 0.5  # ultralytics' Keypoints zero x, y below this visibility


def yolo_label_lines(detections: Sequence[Detection], orig_hw: tuple[int, int],
                     save_conf: bool = False) -> list[str]:
    """ultralytics' ``save_txt`` lines, one per detection (best first):
    ``class cx cy w h`` normalised by the image's width/height, then for pose
    ``x y visibility`` per keypoint (normalised; x, y are 0 where visibility < 0.5), then the
    score when ``save_conf``; numbers in ``%g`` format."""
    h, w = orig_hw
    lines = []
    for det in detections:
        x1, y1, x2, y2 = (float(v) for v in det.box_xyxy)
        line: list[float] = [det.class_id, (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w,
                             (y2 - y1) / h]
        if det.keypoints is not None:
            for x, y, v in np.asarray(det.keypoints, dtype=np.float64):
                seen = v >= KEYPOINT_MIN_VISIBILITY
                line += [x / w if seen else 0.0, y / h if seen else 0.0, v]
        if save_conf:
            line.append(float(det.score))
        lines.append(" ".join("%g" % v for v in line))
    return lines


def segment_label_lines(detections: Sequence[Detection], segments: Sequence[np.ndarray],
                        save_conf: bool = False) -> list[str]:
    """ultralytics' segment ``save_txt`` lines: ``class x1 y1 x2 y2 …`` (the detection's mask
    outline, ``segments[i]`` ``(K, 2)`` normalised to [0, 1]), then the score when ``save_conf``;
    a detection whose outline has fewer than 3 points (no polygon) gets no line."""
    lines = []
    for det, seg in zip(detections, segments):
        if len(seg) < 3:
            continue
        line = [det.class_id, *np.asarray(seg, np.float32).reshape(-1).tolist()]
        if save_conf:
            line.append(float(det.score))
        lines.append(" ".join("%g" % v for v in line))
    return lines


def coco_rle(mask: np.ndarray) -> dict:
    """COCO's compressed run-length encoding of an ``(H, W)`` bool mask, JSON-ready:
    ``{"size": [H, W], "counts": str}`` (pycocotools, so every COCO tool reads it)."""
    from pycocotools import mask as mask_utils

    rle = mask_utils.encode(np.asfortranarray(np.asarray(mask, np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def crop_box(box_xyxy: np.ndarray, orig_hw: tuple[int, int], gain: float = 1.02,
             pad: int = 10) -> tuple[int, int, int, int]:
    """The ``x1, y1, x2, y2`` pixel rectangle ultralytics' ``save_one_box`` crops for a box:
    width and height scaled by ``gain`` plus ``pad`` pixels, truncated to integers, clipped to
    the image."""
    x1, y1, x2, y2 = (float(v) for v in box_xyxy)
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    bw, bh = (x2 - x1) * gain + pad, (y2 - y1) * gain + pad
    h, w = orig_hw
    rect = [int(cx - bw / 2), int(cy - bh / 2), int(cx + bw / 2), int(cy + bh / 2)]
    return (min(max(rect[0], 0), w), min(max(rect[1], 0), h), min(max(rect[2], 0), w),
            min(max(rect[3], 0), h))
