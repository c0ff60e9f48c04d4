"""ultralytics' default detection augmentations on uint8 RGB images and their boxes.

Every function takes and returns an image ``(H, W, 3)`` uint8 with its labels: ``classes`` ``(n,)``
int64 and ``boxes`` ``(n, 4)`` float32 ``x1, y1, x2, y2`` in that image's pixels (OpenCV's
convention: pixel ``i`` covers ``[i, i + 1)``). Randomness comes only from the ``rng`` passed in,
so a seeded generator gives the same result on every run.

The training pipeline (``augment_mosaic`` / ``augment_single``) is ultralytics' ``v8_transforms``
with its default hyperparameters: 4-image mosaic on a ``2s x 2s`` canvas, then a random affine
transform (degrees 0, translate 0.1, scale 0.5, shear 0) cropping to ``s x s``, HSV jitter
(h 0.015, s 0.7, v 0.4) and a left-right flip with p 0.5; without mosaic (its last epochs) the
image is letterboxed to ``s x s`` before the affine transform. Warps use Pillow (bilinear, grey
114 border) where ultralytics uses OpenCV; the HSV jitter works in Pillow's HSV (hue 0..255)
where OpenCV's hue is 0..179 (the same relative change).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from PIL import Image

from .letterbox import resize_bilinear

__all__ = ["AugmentConfig", "Labelled", "augment_mosaic", "augment_single", "box_candidates",
           "hsv_jitter", "letterbox_labelled", "load_resized", "mosaic4", "random_affine",
           "flip_lr", "to_targets"]

PAD = 114


@dataclass(frozen=True)
class AugmentConfig:
    """ultralytics' default detection hyperparameters (``default.yaml``)."""

    degrees: float = 0.0
    translate: float = 0.1
    scale: float = 0.5
    shear: float = 0.0
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    fliplr: float = 0.5


@dataclass
class Labelled:
    """An image and its boxes (see the module docstring for the layouts)."""

    image: np.ndarray
    classes: np.ndarray
    boxes: np.ndarray

    def copy(self) -> "Labelled":
        return Labelled(self.image.copy(), self.classes.copy(), self.boxes.copy())


def load_resized(image: np.ndarray, classes: np.ndarray, boxes_norm: np.ndarray,
                 imgsz: int) -> Labelled:
    """ultralytics' ``load_image``: resize so the long side is ``imgsz`` (aspect kept); the boxes
    ``(n, 4)`` normalised ``cx, cy, w, h`` become pixels of the resized image."""
    h, w = image.shape[:2]
    r = imgsz / max(h, w)
    if r != 1:
        w, h = min(math.ceil(w * r), imgsz), min(math.ceil(h * r), imgsz)
        image = resize_bilinear(image, h, w)
    xy, half = boxes_norm[:, :2], boxes_norm[:, 2:] / 2
    xyxy = np.concatenate([xy - half, xy + half], axis=1) * np.float32([w, h, w, h])
    return Labelled(image, classes.astype(np.int64), xyxy.astype(np.float32))


def mosaic4(parts: Sequence[Labelled], imgsz: int, rng: np.random.Generator) -> Labelled:
    """ultralytics' ``Mosaic._mosaic4``: four images around a random centre of a ``2s x 2s`` grey
    canvas (``s = imgsz``, centre in ``[s/2, 3s/2)``), boxes moved with them and clipped."""
    s = imgsz
    yc, xc = (int(rng.uniform(s // 2, 2 * s - s // 2)) for _ in range(2))
    canvas = np.full((2 * s, 2 * s, 3), PAD, dtype=np.uint8)
    classes, boxes = [], []
    for i, part in enumerate(parts):
        h, w = part.image.shape[:2]
        if i == 0:  # top left
            x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
            x1b, y1b, x2b, y2b = w - (x2a - x1a), h - (y2a - y1a), w, h
        elif i == 1:  # top right
            x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, 2 * s), yc
            x1b, y1b, x2b, y2b = 0, h - (y2a - y1a), min(w, x2a - x1a), h
        elif i == 2:  # bottom left
            x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(2 * s, yc + h)
            x1b, y1b, x2b, y2b = w - (x2a - x1a), 0, w, min(y2a - y1a, h)
        else:  # bottom right
            x1a, y1a, x2a, y2a = xc, yc, min(xc + w, 2 * s), min(2 * s, yc + h)
            x1b, y1b, x2b, y2b = 0, 0, min(w, x2a - x1a), min(y2a - y1a, h)
        canvas[y1a:y2a, x1a:x2a] = part.image[y1b:y2b, x1b:x2b]
        classes.append(part.classes)
        boxes.append(part.boxes + np.float32([x1a - x1b, y1a - y1b] * 2))
    all_boxes = np.clip(np.concatenate(boxes), 0, 2 * s).astype(np.float32)
    return Labelled(canvas, np.concatenate(classes), all_boxes)


def letterbox_labelled(item: Labelled, imgsz: int, scaleup: bool = True) -> Labelled:
    """Letterbox to ``imgsz x imgsz`` (centred, grey padding), boxes moved with the pixels."""
    from .letterbox import letterbox

    lb = letterbox(item.image, imgsz, scaleup=scaleup)
    h, w = item.image.shape[:2]
    unpad_w, unpad_h = max(1, int(round(w * lb.scale))), max(1, int(round(h * lb.scale)))
    gain = np.float32([unpad_w / w, unpad_h / h] * 2)
    boxes = item.boxes * gain + np.float32([lb.pad[0], lb.pad[1]] * 2)
    return Labelled(lb.image, item.classes, boxes.astype(np.float32))


def box_candidates(before: np.ndarray, after: np.ndarray, wh_thr: float = 2, ar_thr: float = 100,
                   area_thr: float = 0.1, eps: float = 1e-16) -> np.ndarray:
    """ultralytics' filter after a warp: boxes ``(n, 4)`` xyxy kept when over ``wh_thr`` pixels
    wide and high, over ``area_thr`` of their warped-unclipped area, aspect below ``ar_thr``."""
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    ar = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < ar_thr)


def random_affine(item: Labelled, rng: np.random.Generator, config: AugmentConfig,
                  border: int = 0) -> Labelled:
    """ultralytics' ``RandomPerspective`` (perspective 0): rotate/scale/shear about the image
    centre, translate, and crop to the input size less ``2 * border`` on each axis (a mosaic
    canvas ``2s`` with ``border = -s/2`` gives ``s``). Boxes are the bounding boxes of their
    moved corners, clipped; those :func:`box_candidates` rejects are dropped."""
    img = item.image
    height, width = img.shape[0] + 2 * border, img.shape[1] + 2 * border
    c = np.eye(3)
    c[0, 2], c[1, 2] = -img.shape[1] / 2, -img.shape[0] / 2
    r = np.eye(3)
    angle = rng.uniform(-config.degrees, config.degrees)
    s = rng.uniform(1 - config.scale, 1 + config.scale)
    a, sn = math.cos(math.radians(angle)) * s, math.sin(math.radians(angle)) * s
    r[:2, :2] = [[a, sn], [-sn, a]]  # OpenCV's getRotationMatrix2D(center 0, angle, s)
    sh = np.eye(3)
    sh[0, 1] = math.tan(math.radians(rng.uniform(-config.shear, config.shear)))
    sh[1, 0] = math.tan(math.radians(rng.uniform(-config.shear, config.shear)))
    t = np.eye(3)
    t[0, 2] = rng.uniform(0.5 - config.translate, 0.5 + config.translate) * width
    t[1, 2] = rng.uniform(0.5 - config.translate, 0.5 + config.translate) * height
    m = t @ sh @ r @ c
    if border != 0 or (m != np.eye(3)).any():
        img = warp_affine(img, m, width, height)
    n = len(item.boxes)
    if n == 0:
        return Labelled(img, item.classes, item.boxes.reshape(0, 4))
    corners = item.boxes[:, [0, 1, 2, 3, 2, 1, 0, 3]].reshape(n * 4, 2)  # x1y1 x2y2 x2y1 x1y2
    xy = np.concatenate([corners, np.ones((n * 4, 1))], axis=1) @ m.T
    xy = xy[:, :2].reshape(n, 8)
    x, y = xy[:, 0::2], xy[:, 1::2]
    moved = np.stack([x.min(1), y.min(1), x.max(1), y.max(1)], axis=1)
    clipped = np.clip(moved, 0, [width, height, width, height]).astype(np.float32)
    keep = box_candidates(item.boxes * s, clipped, area_thr=0.10)
    return Labelled(img, item.classes[keep], clipped[keep])


def warp_affine(image: np.ndarray, m: np.ndarray, width: int, height: int) -> np.ndarray:
    """OpenCV's ``warpAffine(image, m[:2], (width, height), borderValue=114)`` (bilinear) with
    Pillow: output pixel ``(x, y)`` reads input ``m^-1 (x, y)`` in pixel-index coordinates."""
    inv = np.linalg.inv(m)
    # Pillow maps pixel centres (x + 0.5): shift into and out of OpenCV's integer centres
    shift, unshift = np.eye(3), np.eye(3)
    shift[:2, 2], unshift[:2, 2] = 0.5, -0.5
    coeffs = (shift @ inv @ unshift)[:2].reshape(-1)
    out = Image.fromarray(image).transform((width, height), Image.Transform.AFFINE,
                                           tuple(coeffs), resample=Image.Resampling.BILINEAR,
                                           fillcolor=(PAD, PAD, PAD))
    return np.asarray(out)


def hsv_jitter(image: np.ndarray, rng: np.random.Generator, hgain: float, sgain: float,
               vgain: float) -> np.ndarray:
    """ultralytics' ``RandomHSV``: hue shifted and saturation, value scaled by random gains
    ``1 + uniform(-1, 1) * gain``, through lookup tables."""
    if not (hgain or sgain or vgain):
        return image
    r = rng.uniform(-1, 1, 3) * [hgain, sgain, vgain] + 1
    x = np.arange(256, dtype=r.dtype)
    lut_h = ((x * r[0]) % 256).astype(np.uint8)
    lut_s = np.clip(x * r[1], 0, 255).astype(np.uint8)
    lut_v = np.clip(x * r[2], 0, 255).astype(np.uint8)
    hsv = np.asarray(Image.fromarray(image).convert("HSV"))
    out = np.stack([lut_h[hsv[..., 0]], lut_s[hsv[..., 1]], lut_v[hsv[..., 2]]], axis=-1)
    return np.asarray(Image.fromarray(out, mode="HSV").convert("RGB"))


def flip_lr(item: Labelled) -> Labelled:
    """Mirror left-right; ``x1, x2`` become ``w - x2, w - x1``."""
    w = item.image.shape[1]
    boxes = item.boxes.copy()
    boxes[:, [0, 2]] = w - item.boxes[:, [2, 0]]
    return Labelled(np.ascontiguousarray(item.image[:, ::-1]), item.classes, boxes)


def _finish(item: Labelled, rng: np.random.Generator, config: AugmentConfig) -> Labelled:
    item = Labelled(hsv_jitter(item.image, rng, config.hsv_h, config.hsv_s, config.hsv_v),
                    item.classes, item.boxes)
    if rng.random() < config.fliplr:
        item = flip_lr(item)
    return item


def augment_mosaic(parts: Sequence[Labelled], imgsz: int, rng: np.random.Generator,
                   config: AugmentConfig = AugmentConfig()) -> Labelled:
    """Mosaic of four :func:`load_resized` images → random affine to ``imgsz`` → HSV → flip."""
    item = mosaic4(parts, imgsz, rng)
    return _finish(random_affine(item, rng, config, border=-(imgsz // 2)), rng, config)


def augment_single(part: Labelled, imgsz: int, rng: np.random.Generator,
                   config: AugmentConfig = AugmentConfig()) -> Labelled:
    """One :func:`load_resized` image letterboxed to ``imgsz`` → random affine → HSV → flip
    (ultralytics' pipeline once mosaic is closed)."""
    item = letterbox_labelled(part, imgsz)
    return _finish(random_affine(item, rng, config), rng, config)


def to_targets(item: Labelled) -> np.ndarray:
    """``(n, 5)`` float32 rows ``class, cx, cy, w, h`` normalised to the image."""
    h, w = item.image.shape[:2]
    b = item.boxes / np.float32([w, h, w, h])
    xywh = np.concatenate([(b[:, :2] + b[:, 2:]) / 2, b[:, 2:] - b[:, :2]], axis=1)
    return np.concatenate([item.classes[:, None].astype(np.float32), xywh], axis=1).astype(
        np.float32)
