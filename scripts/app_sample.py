"""``candle-nn-app``'s sample image: a small drawn scene (sky, sun, a house, a tree, a road), so the
app works before anything is uploaded and without any data file."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

SIZE = (320, 240)  # (width, height)


def sample_image() -> np.ndarray:
    """The scene, ``(240, 320, 3)`` uint8 RGB; the same on every call."""
    width, height = SIZE
    image = Image.new("RGB", SIZE, (135, 190, 235))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 150, width, height), fill=(95, 160, 70))  # grass
    draw.polygon([(150, 150), (190, 150), (250, height), (90, height)], fill=(120, 120, 125))
    draw.ellipse((250, 20, 295, 65), fill=(250, 215, 60))  # sun
    draw.rectangle((40, 95, 130, 165), fill=(200, 80, 60))  # house
    draw.polygon([(30, 100), (85, 55), (140, 100)], fill=(110, 60, 45))  # roof
    draw.rectangle((75, 125, 97, 165), fill=(90, 55, 35))  # door
    draw.rectangle((205, 115, 217, 170), fill=(100, 70, 40))  # trunk
    draw.ellipse((180, 70, 242, 130), fill=(40, 120, 50))  # crown
    return np.asarray(image).copy()
