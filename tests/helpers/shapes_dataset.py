"""A small detection data set drawn on the fly for the training tests: coloured shapes (class 0
red squares, 1 green discs, 2 blue triangles) with their exact boxes, in ultralytics' layout
(``images/{train,val}``, ``labels/{train,val}``, ``data.yaml``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

NAMES = ["square", "disc", "triangle"]
COLOURS = [(220, 40, 40), (40, 200, 60), (40, 70, 230)]


def draw_image(rng: np.random.Generator, size: int) -> tuple[Image.Image, list[tuple]]:
    """One image with 1-3 non-overlapping shapes; returns it and ``(class, cx, cy, w, h)``
    rows normalised to the image."""
    background = tuple(int(v) for v in rng.integers(90, 170, 3))
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    rows, taken = [], []
    for _ in range(int(rng.integers(1, 4))):
        for _attempt in range(20):
            side = int(rng.integers(size // 5, size // 2))
            x0, y0 = (int(v) for v in rng.integers(0, size - side, 2))
            box = (x0, y0, x0 + side, y0 + side)
            if all(box[2] <= t[0] or box[0] >= t[2] or box[3] <= t[1] or box[1] >= t[3]
                   for t in taken):
                break
        else:
            continue
        taken.append(box)
        cls = int(rng.integers(0, 3))
        x1, y1 = box[2] - 1, box[3] - 1
        if cls == 0:
            draw.rectangle((box[0], box[1], x1, y1), fill=COLOURS[0])
        elif cls == 1:
            draw.ellipse((box[0], box[1], x1, y1), fill=COLOURS[1])
        else:
            draw.polygon([(box[0], y1), (x1, y1), ((box[0] + x1) / 2, box[1])], fill=COLOURS[2])
        rows.append((cls, (box[0] + box[2]) / 2 / size, (box[1] + box[3]) / 2 / size,
                     side / size, side / size))
    return image, rows


def make_shapes(root: Path, n_train: int = 96, n_val: int = 32, size: int = 128,
                seed: int = 0) -> Path:
    """Write the data set under ``root``; returns its data.yaml."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            image, rows = draw_image(rng, size)
            image.save(root / "images" / split / f"{i:04d}.png")
            (root / "labels" / split / f"{i:04d}.txt").write_text(
                "".join(f"{c} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}\n" for c, cx, cy, w, h in rows))
    data = root / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: {NAMES}\n")
    return data
