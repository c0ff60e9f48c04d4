"""Drawing YOLO detections: masks, boxes, labels with scores, and pose skeletons (what
``Result.plot`` returns and ``candle-yolo-v8`` saves).

Line width, label font and keypoint size scale with the image (as ultralytics' ``Annotator``), so
the annotation reads the same on a thumbnail and on a 4000-pixel photo.
"""

from __future__ import annotations

import colorsys
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from candle_nn_models.yolo_v8_post import Detection

MASK_ALPHA = 0.5  # ultralytics' Annotator.masks blends each mask at this opacity
KEYPOINT_MIN_VISIBILITY = 0.5  # keypoints (and the limbs between them) below this are not drawn
_LIMB_COLOR = (255, 60, 160)
_KEYPOINT_COLOR = (40, 220, 255)


def class_color(class_id: int) -> tuple[int, int, int]:
    """A stable, saturated colour per class (hues spread by the golden ratio)."""
    r, g, b = colorsys.hsv_to_rgb((class_id * 0.618033988749895 + 0.07) % 1.0, 0.8, 0.95)
    return int(r * 255), int(g * 255), int(b * 255)


def _text_color(fill: tuple[int, int, int]) -> tuple[int, int, int]:
    luminance = 0.299 * fill[0] + 0.587 * fill[1] + 0.114 * fill[2]
    return (0, 0, 0) if luminance > 150 else (255, 255, 255)


def draw_detections(image: np.ndarray, detections: Sequence[Detection], names: Sequence[str],
                    skeleton: Sequence[tuple[int, int]] = (), *, line_width: int | None = None,
                    labels: bool = True, scores: bool = True) -> Image.Image:
    """A copy of ``image`` (``(H, W, 3)`` uint8 RGB) with every detection drawn.

    Masks (segmentation) first, each blended in its class colour at ``MASK_ALPHA``, best
    detection on top; then boxes in the class colour with a ``name score`` label above (inside
    when at the top edge);
    for detections with keypoints, the ``skeleton`` limbs and the keypoints whose visibility is at
    least ``KEYPOINT_MIN_VISIBILITY``. As ultralytics' ``line_width`` / ``hide_labels`` /
    ``hide_conf``: ``line_width`` sets the box (and limb) width in pixels (default: scaled to the
    image), ``labels=False`` draws no label, ``scores=False`` labels with the name only.
    """
    img = Image.fromarray(_draw_masks(image, detections)).convert("RGB")
    draw = ImageDraw.Draw(img)
    side = (img.width + img.height) / 2
    width = line_width if line_width is not None else max(round(side * 0.003), 2)
    font = ImageFont.load_default(size=max(round(side * 0.025), 12))
    radius = max(round(width * 1.5), 2)
    # Lowest score first, so that the best detections end on top.
    for det in sorted(detections, key=lambda d: d.score):
        color = class_color(det.class_id)
        x1, y1, x2, y2 = (float(v) for v in det.box_xyxy)
        draw.rectangle((x1, y1, x2, y2), outline=color, width=width)
        if labels:
            name = names[det.class_id] if det.class_id < len(names) else str(det.class_id)
            _draw_label(draw, f"{name} {det.score:.2f}" if scores else name, (x1, y1), color,
                        font, width, img.width)
        if det.keypoints is not None:
            _draw_pose(draw, det.keypoints, skeleton, width, radius)
    return img


def _draw_masks(image: np.ndarray, detections: Sequence[Detection]) -> np.ndarray:
    """``image`` with the detections' masks blended in, lowest score first."""
    masked = [d for d in sorted(detections, key=lambda d: d.score) if d.mask is not None]
    if not masked:
        return image
    out = image.astype(np.float32)
    for det in masked:
        color = np.float32(class_color(det.class_id))
        out[det.mask] = (1 - MASK_ALPHA) * out[det.mask] + MASK_ALPHA * color
    return out.round().clip(0, 255).astype(np.uint8)


def _draw_label(draw: ImageDraw.ImageDraw, label: str, corner: tuple[float, float],
                color: tuple[int, int, int], font, width: int, image_width: int) -> None:
    """``label`` on a ``color`` box above ``corner`` (inside the box when at the top edge)."""
    x1, y1 = corner
    left, top, right, bottom = draw.textbbox((0, 0), label, font=font)
    tw, th = right - left + 2 * width, bottom - top + 2 * width
    ty = y1 - th if y1 - th >= 0 else y1
    tx = min(x1, max(image_width - tw, 0))
    draw.rectangle((tx, ty, tx + tw, ty + th), fill=color)
    draw.text((tx + width - left, ty + width - top), label, fill=_text_color(color), font=font)


def _draw_pose(draw: ImageDraw.ImageDraw, keypoints: np.ndarray,
               skeleton: Sequence[tuple[int, int]], width: int, radius: int) -> None:
    visible = keypoints[:, 2] >= KEYPOINT_MIN_VISIBILITY
    for a, b in skeleton:
        if a < len(keypoints) and b < len(keypoints) and visible[a] and visible[b]:
            draw.line([tuple(map(float, keypoints[a, :2])), tuple(map(float, keypoints[b, :2]))],
                      fill=_LIMB_COLOR, width=width)
    for x, y, _ in keypoints[visible]:
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=_KEYPOINT_COLOR)
