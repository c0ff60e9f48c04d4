"""``results.png``: a training run's loss and mAP curves, drawn with Pillow (no plotting
library): one small panel per ``results.csv`` column, value against epoch."""

from __future__ import annotations

import os
from typing import Sequence

from PIL import Image, ImageDraw

__all__ = ["PANELS", "plot_results"]

PANELS = ("train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision(B)",
          "metrics/recall(B)", "val/box_loss", "val/cls_loss", "val/dfl_loss",
          "metrics/mAP50(B)", "metrics/mAP50-95(B)")
_W, _H, _M = 300, 220, 30  # panel size and margin, pixels


def plot_results(history: Sequence[dict[str, float]], path: "str | os.PathLike") -> None:
    """Write a 5 x 2 grid of line plots of ``history``'s :data:`PANELS` (PNG)."""
    image = Image.new("RGB", (5 * _W, 2 * _H), "white")
    draw = ImageDraw.Draw(image)
    epochs = [row["epoch"] for row in history]
    for n, name in enumerate(PANELS):
        x0, y0 = (n % 5) * _W, (n // 5) * _H
        left, top, right, bottom = x0 + _M + 10, y0 + _M, x0 + _W - 10, y0 + _H - _M
        draw.rectangle((left, top, right, bottom), outline=(160, 160, 160))
        draw.text((x0 + _M, y0 + 8), name, fill="black")
        values = [row[name] for row in history]
        if not values:
            continue
        lo, hi = min(values), max(values)
        span = (hi - lo) or 1.0
        e0, e1 = min(epochs), max(epochs)
        xs = [left + (right - left) * ((e - e0) / (e1 - e0) if e1 > e0 else 0.5) for e in epochs]
        ys = [bottom - (bottom - top) * (v - lo) / span for v in values]
        if len(xs) > 1:
            draw.line(list(zip(xs, ys)), fill=(31, 119, 180), width=2)
        for x, y in zip(xs, ys):
            draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=(31, 119, 180))
        draw.text((x0 + 4, top), f"{hi:.3g}", fill="black")
        draw.text((x0 + 4, bottom - 10), f"{lo:.3g}", fill="black")
        draw.text((left, bottom + 4), f"{e0:g}", fill="black")
        draw.text((right - 20, bottom + 4), f"{e1:g}", fill="black")
    image.save(os.fspath(path), format="PNG")
