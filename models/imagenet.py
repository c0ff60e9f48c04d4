"""ImageNet classification pre-processing and labels (torchvision's recipe).

RGB uint8 ``(H, W, 3)`` → shorter side resized to 256 (bilinear, antialiased, PIL) → centre crop
224 → ``/255`` → ImageNet mean/std → ``(224, 224, 3)`` float32 (NHWC when batched).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Sequence

import numpy as np
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
RESIZE = 256
CROP = 224


def preprocess(rgb: np.ndarray, resize: int = RESIZE, crop: int = CROP) -> np.ndarray:
    """One image: uint8 ``(H, W, 3)`` → normalised float32 ``(crop, crop, 3)``."""
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"expected a uint8 (H, W, 3) RGB image, got {rgb.dtype} {rgb.shape}")
    h, w = rgb.shape[:2]
    # torchvision's Resize(int): the shorter side becomes `resize`, the longer one is truncated.
    if h <= w:
        size = (int(resize * w / h), resize)
    else:
        size = (resize, int(resize * h / w))
    resized = np.asarray(Image.fromarray(rgb).resize(size, Image.Resampling.BILINEAR))
    rh, rw = resized.shape[:2]
    top, left = int(round((rh - crop) / 2.0)), int(round((rw - crop) / 2.0))
    cropped = resized[top:top + crop, left:left + crop].astype(np.float32) / 255.0
    return (cropped - MEAN) / STD


def preprocess_batch(images: Sequence[np.ndarray]) -> np.ndarray:
    """Several images → ``(N, 224, 224, 3)`` float32, the model's NHWC input."""
    return np.stack([preprocess(img) for img in images])


@lru_cache(maxsize=1)
def class_names() -> tuple[str, ...]:
    """The 1000 ImageNet-1k class names, in the index order of the classifier."""
    text = resources.files(__package__).joinpath("data/imagenet_classes.txt").read_text("utf-8")
    names = tuple(line for line in text.splitlines() if line)
    assert len(names) == 1000, len(names)
    return names
