"""The prompts of ``SamModel.predict``: points and a box in original-image pixels, checked
against the image before the encoder runs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from candle_nn import CandleNNError

__all__ = ["PromptError", "Prompts"]


class PromptError(CandleNNError):
    """A point or box prompt is malformed or outside the image."""


@dataclass
class Prompts:
    """Prompts in original-image pixels: ``points`` ``(x, y)``, their ``labels`` (1 foreground,
    0 background) and an optional ``box`` ``(x1, y1, x2, y2)``."""

    points: list[tuple[float, float]] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    box: tuple[float, float, float, float] | None = None

    @classmethod
    def of(cls, points: Any, labels: Any, box: Any, height: int, width: int) -> "Prompts":
        """Checked prompts for an ``height x width`` image: ``points`` ``(N, 2)`` pixels,
        ``labels`` ``(N,)`` of 1 and 0 (default: all 1), ``box`` ``(4,)``; PromptError naming
        what is wrong."""
        prompts = cls()
        if points is not None:
            coords = _finite(points, "points", "(N, 2) (x, y) pixels, e.g. [[580, 240]]")
            if coords.ndim != 2 or coords.shape[1] != 2 or len(coords) == 0:
                raise PromptError(f"points: got shape {coords.shape}; pass (N, 2) (x, y) pixels, "
                                  "e.g. [[580, 240]]")
            marks = np.ones(len(coords)) if labels is None else np.asarray(labels).reshape(-1)
            if len(marks) != len(coords) or not np.isin(marks, (0, 1)).all():
                raise PromptError(f"labels: pass one label per point, 1 (foreground) or 0 "
                                  f"(background): got {marks.tolist()} for {len(coords)} points")
            for x, y in coords:
                _inside(x, y, height, width, "points")
            prompts.points = [(float(x), float(y)) for x, y in coords]
            prompts.labels = [int(v) for v in marks]
        elif labels is not None:
            raise PromptError("labels were given without points: pass points=[[x, y], ...]")
        if box is not None:
            b = _finite(box, "box", "(x1, y1, x2, y2) pixels").reshape(-1)
            if b.shape != (4,):
                raise PromptError(f"box: got {b.size} values; pass (x1, y1, x2, y2) pixels")
            x1, y1, x2, y2 = (float(v) for v in b)
            _inside(x1, y1, height, width, "box")
            _inside(x2, y2, height, width, "box")
            if x2 <= x1 or y2 <= y1:
                raise PromptError(f"box: need x1 < x2 and y1 < y2 (top-left corner first), got "
                                  f"x {x1:g}..{x2:g}, y {y1:g}..{y2:g} pixels")
            prompts.box = (x1, y1, x2, y2)
        if not prompts.points and prompts.box is None:
            raise PromptError("no prompt given: pass points=[[x, y], ...] (with labels) and/or "
                              "box=[x1, y1, x2, y2], in pixels")
        return prompts

    def describe(self) -> str:
        pos = sum(1 for label in self.labels if label == 1)
        neg = len(self.labels) - pos
        box = "no box" if self.box is None else "box " + ",".join(f"{v:g}" for v in self.box)
        return f"{pos} point(s), {neg} negative point(s), {box}"

    def to_json(self) -> dict:
        return {"points": [list(p) for p in self.points], "labels": list(self.labels),
                "box": list(self.box) if self.box is not None else None}


def _finite(value: Any, name: str, want: str) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise PromptError(f"{name}: {value!r} is not numbers; pass {want}") from None
    if not np.isfinite(array).all():
        raise PromptError(f"{name}: {array.tolist()} has a non-finite value; pass {want}")
    return array


def _inside(x: float, y: float, height: int, width: int, name: str) -> None:
    if not (0.0 <= x <= width and 0.0 <= y <= height) or math.isnan(x + y):
        raise PromptError(f"{name}: ({x:g}, {y:g}) is outside the {width}x{height} image "
                          f"(x in 0..{width}, y in 0..{height} pixels)")
