"""What ``candle-segment-anything`` draws besides the mask PNGs: an overlay with every mask in its
own colour (its mask records, COCO run-length encodings: the SAM API's ``mask_json``)."""

from __future__ import annotations

import colorsys
from typing import Sequence

import numpy as np
from PIL import Image

from candle_nn_models.sam import mask_json

__all__ = ["mask_json", "overlay_masks", "palette"]  # mask_json: the SAM API's, for the app


def palette(n: int) -> np.ndarray:
    """``(n, 3)`` uint8 colours, far apart in hue (golden-ratio steps), bright and saturated."""
    hues = (np.arange(n) * 0.618033988749895 + 0.12) % 1.0
    return np.array([[round(255 * c) for c in colorsys.hsv_to_rgb(h, 0.85, 0.95)] for h in hues],
                    dtype=np.uint8).reshape(n, 3)


def overlay_masks(rgb: np.ndarray, masks: Sequence[np.ndarray], alpha: float = 0.55) -> Image.Image:
    """The image with each ``(H, W)`` boolean mask tinted in its own colour (largest first, so
    smaller masks stay visible on top) and its outline drawn."""
    out = rgb.astype(np.float32)
    colours = palette(len(masks)).astype(np.float32)
    for i in sorted(range(len(masks)), key=lambda j: -int(masks[j].sum())):
        mask = masks[i]
        out[mask] = (1 - alpha) * out[mask] + alpha * colours[i]
        edge = mask & ~_eroded(mask)
        out[edge] = colours[i]
    return Image.fromarray(out.round().clip(0, 255).astype(np.uint8))


def _eroded(mask: np.ndarray) -> np.ndarray:
    inner = mask.copy()
    inner[1:] &= mask[:-1]
    inner[:-1] &= mask[1:]
    inner[:, 1:] &= mask[:, :-1]
    inner[:, :-1] &= mask[:, 1:]
    return inner
