"""torchvision's standard classification transforms, on NumPy/Pillow, for NHWC float batches.

Training (torchvision's reference recipe): ``RandomResizedCrop(size, scale=(0.08, 1),
ratio=(3/4, 4/3))`` (bilinear, antialiased) → ``RandomHorizontalFlip(0.5)`` → ``/255`` →
ImageNet mean/std. Evaluation: shorter side resized to ``size * 256 / 224`` → centre crop
``size`` → the same normalisation (:func:`candle_nn_models.imagenet.preprocess`; 256/224 at
``size=224``).

Each random draw comes from a generator the caller passes; the trainer seeds one per
``(seed, epoch, image index)``, so an image's augmentation does not depend on which worker or
rank decodes it, nor on whether the run was resumed.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from candle_nn_models.imagenet import CROP, MEAN, RESIZE, STD, preprocess

SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)


def random_resized_crop_box(rng: np.random.Generator, height: int, width: int,
                            scale: tuple[float, float] = SCALE,
                            ratio: tuple[float, float] = RATIO) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of a random crop, as ``RandomResizedCrop.get_params`` draws it: up to
    10 tries of an area fraction in ``scale`` and a log-uniform aspect ratio in ``ratio``, then
    the centre crop with the ratio clamped."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def train_transform(rgb: np.ndarray, rng: np.random.Generator, size: int = CROP) -> np.ndarray:
    """uint8 ``(H, W, 3)`` → augmented, normalised float32 ``(size, size, 3)``."""
    top, left, h, w = random_resized_crop_box(rng, rgb.shape[0], rgb.shape[1])
    crop = Image.fromarray(rgb).resize((size, size), Image.Resampling.BILINEAR,
                                       box=(left, top, left + w, top + h))
    out = np.asarray(crop, dtype=np.float32) / 255.0
    if rng.random() < 0.5:
        out = out[:, ::-1]
    return (out - MEAN) / STD


def eval_resize(size: int) -> int:
    """The shorter side an evaluation image is resized to before its centre ``size`` crop."""
    return int(size * RESIZE / CROP)


def eval_transform(rgb: np.ndarray, size: int = CROP) -> np.ndarray:
    """uint8 ``(H, W, 3)`` → resized, centre-cropped, normalised float32 ``(size, size, 3)``."""
    return preprocess(rgb, resize=eval_resize(size), crop=size)
