"""YOLOv8-seg's instance masks from mask coefficients and prototypes, as ultralytics' ``ops``
(``process_mask``, ``process_mask_native``, ``crop_mask``, ``scale_masks``, ``masks2segments``).

A mask is ``sigmoid(coefficients · prototypes) > 0.5``, i.e. the linear combination ``> 0``, cut to
its box. ultralytics makes it two ways, and so do we:

* :func:`process_mask` (default): the ``(H/4, W/4)`` combination upsampled bilinearly to the
  model input ``(H, W)``, thresholded, cropped to the box in input pixels.
* :func:`process_mask_native` (``retina_masks``): upsampled straight to the original image
  (letterbox padding cut on the way), cropped to the box in original pixels.

Everything here runs in NumPy on the host, after the model. Bilinear resizes are PyTorch's
``F.interpolate(mode="bilinear", align_corners=False)``, written as one matrix per axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
import numpy as np

from candle_nn.upsample import bilinear_resize_matrix

from .letterbox import Letterbox
from .yolo_v8_post import Detection, postprocess

__all__ = ["InstanceMasks", "crop_mask", "instance_masks", "masks2segments", "process_mask",
           "process_mask_native", "scale_masks", "segment_postprocess"]


def _combine(protos: np.ndarray, coefficients: np.ndarray) -> np.ndarray:
    """``(mh, mw, C)`` prototypes · ``(N, C)`` coefficients → ``(N, mh, mw)`` float32 logits."""
    mh, mw, c = protos.shape
    flat = np.asarray(protos, np.float32).reshape(mh * mw, c)
    return (np.asarray(coefficients, np.float32) @ flat.T).reshape(-1, mh, mw)


def _resize(masks: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``(N, h, w)`` → ``(N, H, W)`` by ``rows`` ``(H, h)`` and ``cols`` ``(W, w)``."""
    return np.einsum("Hh,nhw,Ww->nHW", rows.astype(np.float32), masks, cols.astype(np.float32),
                     optimize=True)


_CHUNK_PIXELS = 16_000_000  # float32 mask pixels upsampled at once (64 MB), as ultralytics


def _binary_chunks(masks: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``_resize(masks, rows, cols) > 0`` as uint8, a bounded number of masks at a time."""
    out = np.empty((len(masks), len(rows), len(cols)), np.uint8)
    step = max(1, _CHUNK_PIXELS // (len(rows) * len(cols)))
    for i in range(0, len(masks), step):
        out[i:i + step] = _resize(masks[i:i + step], rows, cols) > 0
    return out


def crop_mask(masks: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Zero ``masks`` ``(N, H, W)`` outside each ``(N, 4)`` xyxy box (pixel ``(r, c)`` is kept when
    ``x1 <= c < x2`` and ``y1 <= r < y2``, as ultralytics)."""
    _, h, w = masks.shape
    boxes = np.asarray(boxes, np.float32)
    cols = np.arange(w, dtype=np.float32)[None, None, :]
    rows = np.arange(h, dtype=np.float32)[None, :, None]
    x1, y1, x2, y2 = (boxes[:, i, None, None] for i in range(4))
    return masks * ((cols >= x1) & (cols < x2)) * ((rows >= y1) & (rows < y2))


def process_mask(protos: np.ndarray, coefficients: np.ndarray, boxes: np.ndarray,
                 shape: tuple[int, int], upsample: bool = True) -> np.ndarray:
    """ultralytics' ``process_mask``: binary uint8 masks ``(N, H, W)`` at the model input
    ``shape = (H, W)`` (``upsample=False``: at the prototypes' resolution).

    Args:
        protos: one image's prototypes ``(H/4, W/4, C)`` (NHWC, as :class:`YoloV8Seg` returns).
        coefficients: ``(N, C)`` mask coefficients of the kept detections.
        boxes: ``(N, 4)`` xyxy boxes in input pixels.
    """
    mh, mw, _ = protos.shape
    if len(coefficients) == 0:
        return np.zeros((0, *(shape if upsample else (mh, mw))), np.uint8)
    masks = _combine(protos, coefficients)
    boxes = np.asarray(boxes, np.float32)
    if upsample:
        return crop_mask(_binary_chunks(masks, bilinear_resize_matrix(mh, shape[0]),
                                        bilinear_resize_matrix(mw, shape[1])), boxes)
    ratios = np.float32([mw / shape[1], mh / shape[0], mw / shape[1], mh / shape[0]])
    return crop_mask((masks > 0).astype(np.uint8), boxes * ratios)


def _content(size_in: tuple[int, int], shape: tuple[int, int]) -> tuple[int, int, int, int]:
    """``(top, bottom, left, right)`` of a letterboxed ``shape`` image inside ``size_in``, as
    ultralytics' ``scale_masks`` computes it from the shapes alone."""
    (h1, w1), (h0, w0) = size_in, shape
    gain = min(h1 / h0, w1 / w0)
    pad_w, pad_h = (w1 - max(round(w0 * gain), 1)) / 2, (h1 - max(round(h0 * gain), 1)) / 2
    top, left = round(pad_h - 0.1), round(pad_w - 0.1)
    return top, top + max(round(h0 * gain), 1), left, left + max(round(w0 * gain), 1)


def _scale_matrix(size_in: int, start: int, stop: int, size_out: int,
                  pre: np.ndarray | None = None) -> np.ndarray:
    """One axis of ``scale_masks``: (optionally ``pre``-resized) → crop ``[start, stop)`` →
    bilinear to ``size_out``, as one ``(size_out, size_in)`` matrix."""
    crop = np.eye(size_in)[start:stop]
    out = bilinear_resize_matrix(stop - start, size_out) @ crop
    return out @ pre if pre is not None else out


def scale_masks(masks: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """ultralytics' ``scale_masks``: float ``(N, h, w)`` masks of a letterboxed input → the
    original image's ``shape = (H, W)``: the padding cut, the rest resized bilinearly."""
    h, w = masks.shape[1:]
    if (h, w) == tuple(shape):
        return masks.astype(np.float32)
    top, bottom, left, right = _content((h, w), shape)
    return _resize(masks.astype(np.float32), _scale_matrix(h, top, bottom, shape[0]),
                   _scale_matrix(w, left, right, shape[1]))


def process_mask_native(protos: np.ndarray, coefficients: np.ndarray, boxes: np.ndarray,
                        shape: tuple[int, int]) -> np.ndarray:
    """ultralytics' ``process_mask_native`` (``retina_masks``): binary uint8 masks ``(N, H, W)`` at
    the original image's ``shape``, ``boxes`` ``(N, 4)`` xyxy in original pixels. The prototypes
    are first upsampled by the smallest factor (1, 2 or 4) that puts the letterbox padding on
    whole pixels, then cut and resized to ``shape``."""
    mh, mw, _ = protos.shape
    h, w = shape
    if len(coefficients) == 0:
        return np.zeros((0, h, w), np.uint8)
    gain = min(4 * mh / h, 4 * mw / w)
    pad = (4 * mh - max(round(h * gain), 1)) | (4 * mw - max(round(w * gain), 1))
    f = 4 // math.gcd(4, pad | pad // 2)
    pre_h = bilinear_resize_matrix(mh, f * mh) if f > 1 else None
    pre_w = bilinear_resize_matrix(mw, f * mw) if f > 1 else None
    top, bottom, left, right = _content((f * mh, f * mw), shape)
    if (f * mh, f * mw) == (h, w):
        rows, cols = (pre_h if f > 1 else np.eye(mh)), (pre_w if f > 1 else np.eye(mw))
    else:
        rows = _scale_matrix(f * mh, top, bottom, h, pre_h)
        cols = _scale_matrix(f * mw, left, right, w, pre_w)
    return crop_mask(_binary_chunks(_combine(protos, coefficients), rows, cols), boxes)


def masks2segments(masks: np.ndarray) -> list[np.ndarray]:
    """ultralytics' ``masks2segments`` (strategy ``"all"``): per binary mask ``(N, H, W)``, its
    outer contours (OpenCV's ``findContours``, external, simple chain) joined into one polygon by
    ``merge_multi_segment``; ``(K, 2)`` float32 x, y pixel corners ((0, 2) for an empty mask)."""
    import cv2  # OpenCV: the contour tracer ultralytics uses, so polygons are the same

    out = []
    for mask in np.ascontiguousarray(np.asarray(masks, np.uint8)):
        contours = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)[0]
        if not contours:
            out.append(np.zeros((0, 2), np.float32))
        elif len(contours) == 1:
            out.append(contours[0].reshape(-1, 2).astype(np.float32))
        else:
            merged = _merge_multi_segment([c.reshape(-1, 2) for c in contours])
            out.append(np.concatenate(merged).astype(np.float32))
    return out


def _min_index(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    dist = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    i, j = np.unravel_index(np.argmin(dist, axis=None), dist.shape)
    return int(i), int(j)


def _merge_multi_segment(segments: list[np.ndarray]) -> list[np.ndarray]:
    """ultralytics' ``merge_multi_segment``: the polygons joined, each to the next, through their
    closest points, walked forward then back so the result is one closed outline."""
    segments = [np.asarray(s).reshape(-1, 2) for s in segments]
    idx_list: list[list[int]] = [[] for _ in segments]
    for i in range(1, len(segments)):
        idx1, idx2 = _min_index(segments[i - 1], segments[i])
        idx_list[i - 1].append(idx1)
        idx_list[i].append(idx2)
    out = []
    last = len(idx_list) - 1
    for i, idx in enumerate(idx_list):
        if len(idx) == 2 and idx[0] > idx[1]:
            idx = [len(segments[i]) - 1 - x for x in idx]
            segments[i] = segments[i][::-1, :]
        segments[i] = np.roll(segments[i], -idx[0], axis=0)
        segments[i] = np.concatenate([segments[i], segments[i][:1]])
        if i in (0, last):
            out.append(segments[i])
        else:
            out.append(segments[i][: idx[1] - idx[0] + 1])
        idx_list[i] = idx
    for i in range(last, -1, -1):
        if i not in (0, last):
            idx = idx_list[i]
            out.append(segments[i][abs(idx[1] - idx[0]):])
    return out


@dataclass
class InstanceMasks:
    """One image's masks as ultralytics' ``Results.masks`` holds them, and their conversions.

    Attributes:
        data: ``(N, h, w)`` uint8 0/1, at the model input's size (``process_mask``) or, for
            ``retina`` masks, the original image's.
        orig_hw: the original image's ``(height, width)``.
    """

    data: np.ndarray
    orig_hw: tuple[int, int]

    def original(self, i: int) -> np.ndarray:
        """Mask ``i`` as ``(H, W)`` bool on the original image (``scale_masks`` of the 0/1 mask,
        ``> 0.5``). Only the output rows and columns that read the mask's pixels are computed
        (the rest are exactly 0), so the cost follows the object's size, not the image's."""
        mask = self.data[i]
        if mask.shape == tuple(self.orig_hw):
            return mask.astype(bool)
        out = np.zeros(self.orig_hw, bool)
        ys, xs = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        if not len(ys):
            return out
        rows, cols = self._scale_matrices()
        (a, b), (c, d) = (ys[0], ys[-1] + 1), (xs[0], xs[-1] + 1)
        r = np.flatnonzero(rows[:, a:b].any(axis=1))
        k = np.flatnonzero(cols[:, c:d].any(axis=1))
        r0, r1, k0, k1 = r[0], r[-1] + 1, k[0], k[-1] + 1
        sub = rows[r0:r1, a:b] @ mask[a:b, c:d].astype(np.float32) @ cols[k0:k1, c:d].T
        out[r0:r1, k0:k1] = sub > 0.5
        return out

    def _scale_matrices(self) -> tuple[np.ndarray, np.ndarray]:
        """``scale_masks``' row and column matrices from the mask size to the original image."""
        if not hasattr(self, "_matrices"):
            (h, w), (h0, w0) = self.data.shape[1:], self.orig_hw
            top, bottom, left, right = _content((h, w), self.orig_hw)
            self._matrices = (_scale_matrix(h, top, bottom, h0).astype(np.float32),
                              _scale_matrix(w, left, right, w0).astype(np.float32))
        return self._matrices

    def segments(self) -> list[np.ndarray]:
        """ultralytics' ``masks.xyn``: per mask its polygon ``(K, 2)``, x, y normalised to
        [0, 1] by the original image's width and height."""
        h1, w1 = self.data.shape[1:]
        h0, w0 = self.orig_hw
        gain = min(h1 / h0, w1 / w0)
        new_h, new_w = max(round(h0 * gain), 1), max(round(w0 * gain), 1)
        pad = round((w1 - new_w) / 2 - 0.1), round((h1 - new_h) / 2 - 0.1)
        out = []
        for xy in masks2segments(self.data):
            xy = (xy - np.float32(pad)) / np.float32([new_w / w0, new_h / h0])
            xy = np.clip(xy, 0, np.float32([w0, h0])) / np.float32([w0, h0])
            out.append(xy.astype(np.float32))
        return out


def instance_masks(protos: np.ndarray, coefficients: np.ndarray, input_boxes: np.ndarray,
                   lb: Letterbox, retina: bool = False) -> InstanceMasks:
    """The masks of one image's kept detections: ``protos`` ``(H/4, W/4, C)``, ``coefficients``
    ``(N, C)``, ``input_boxes`` ``(N, 4)`` xyxy in input pixels, ``lb`` the letterbox that made
    the input; ``retina``: :func:`process_mask_native` instead of :func:`process_mask`."""
    if retina:
        data = process_mask_native(protos, coefficients, lb.to_original(input_boxes), lb.orig_hw)
    else:
        data = process_mask(protos, coefficients, input_boxes, lb.input_hw)
    return InstanceMasks(data, lb.orig_hw)


def segment_postprocess(pred, protos, letterboxes: "list[Letterbox]", *, num_classes: int,
                        num_masks: int, retina: bool = False, **nms
                        ) -> list[tuple[list[Detection], InstanceMasks]]:
    """Detections with masks per image from :class:`YoloV8Seg`'s ``(pred, protos)``, as
    ultralytics' segment predictor: NMS (:func:`~candle_nn_models.yolo_v8_post.postprocess`,
    ``nms``: its ``conf``, ``iou``, ``max_det``, ``agnostic``, ``classes``), masks by
    :func:`process_mask` (``retina``: :func:`process_mask_native`), detections whose mask is
    empty dropped. Each :class:`Detection` gets its ``mask`` on the original image; the
    :class:`InstanceMasks` hold them at ultralytics' resolution (for polygons)."""
    protos = np.asarray(protos, np.float32)
    out = []
    for image, lb, proto in zip(postprocess(pred, letterboxes, num_classes=num_classes,
                                            num_masks=num_masks, **nms), letterboxes, protos):
        if not image:
            out.append(([], InstanceMasks(np.zeros((0, *lb.input_hw), np.uint8), lb.orig_hw)))
            continue
        coefficients = np.stack([d.mask_coefficients for d in image])
        boxes = np.stack([d.input_box_xyxy for d in image])
        masks = instance_masks(proto, coefficients, boxes, lb, retina)
        keep = np.flatnonzero(masks.data.reshape(len(image), -1).max(axis=1) > 0)
        masks = InstanceMasks(masks.data[keep], lb.orig_hw)
        image = [image[k] for k in keep]
        for i, det in enumerate(image):
            det.mask = masks.original(i)
        out.append((image, masks))
    return out

