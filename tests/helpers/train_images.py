"""A small generated image-classification set for the training tests: four texture classes
(horizontal stripes, vertical stripes, checkerboards, dot grids) in random colours, periods,
phases and noise, written as PNGs in the ImageFolder layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ("checker", "dots", "horizontal", "vertical")


def texture(kind: str, rng: np.random.Generator, size: int = 64) -> np.ndarray:
    """One ``(size, size, 3)`` uint8 image of class ``kind``."""
    period = rng.uniform(6.0, 14.0)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64) + rng.uniform(0, period, size=2)[:, None,
                                                                                          None]
    if kind == "horizontal":
        mask = (yy // (period / 2)) % 2 == 0
    elif kind == "vertical":
        mask = (xx // (period / 2)) % 2 == 0
    elif kind == "checker":
        mask = ((yy // (period / 2)) + (xx // (period / 2))) % 2 == 0
    elif kind == "dots":
        cy, cx = (yy % period) - period / 2, (xx % period) - period / 2
        mask = cy ** 2 + cx ** 2 < (period * rng.uniform(0.2, 0.3)) ** 2
    else:
        raise ValueError(kind)
    fg, bg = rng.uniform(170, 255, size=3), rng.uniform(0, 85, size=3)
    image = np.where(mask[..., None], fg, bg) + rng.normal(0, 12, size=(size, size, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def write_textures(root: Path, per_class: int, seed: int = 0, size: int = 64) -> Path:
    """``root/<class>/<i>.png``, ``per_class`` images of each class; returns ``root``."""
    rng = np.random.default_rng(seed)
    for kind in CLASSES:
        folder = root / kind
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(texture(kind, rng, size)).save(folder / f"{i:03d}.png")
    return root
