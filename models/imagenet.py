"""ImageNet classification pre-processing and labels (torchvision's recipe).

RGB uint8 ``(H, W, 3)`` → shorter side resized to 256 (bilinear, antialiased, PIL) → centre crop
224 → ``/255`` → ImageNet mean/std → ``(224, 224, 3)`` float32 (NHWC when batched).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Sequence

from candle_nn import ShapeMismatchError
from candle_nn.inputs import check_rgb_image
import numpy as np
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
RESIZE = 256
CROP = 224
LONG_SIDE_LIMIT = 8  # x resize: beyond, only the centre crop's span is resized (same result)


def preprocess(rgb: np.ndarray, resize: int = RESIZE, crop: int = CROP,
               mean: np.ndarray | None = MEAN, std: np.ndarray | None = STD) -> np.ndarray:
    """One image: uint8 ``(H, W, 3)`` → normalised float32 ``(crop, crop, 3)`` (``mean`` /
    ``std`` ``None``: left in [0, 1], as ultralytics' classifiers read it)."""
    rgb = check_rgb_image(rgb, where="imagenet.preprocess")
    h, w = rgb.shape[:2]
    # torchvision's Resize(int): the shorter side becomes `resize`, the longer one is truncated.
    if h <= w:
        size = (int(resize * w / h), resize)
    else:
        size = (resize, int(resize * h / w))
    top, left = int(round((size[1] - crop) / 2.0)), int(round((size[0] - crop) / 2.0))
    box, out = [0.0, 0.0, float(w), float(h)], list(size)
    for axis, (extent, start) in enumerate(((w, left), (h, top))):
        if size[axis] > LONG_SIDE_LIMIT * resize:
            # Extreme aspect ratio (an 8000x1 image would resize to 2 Mpx x 256): resize only the
            # source span the centre crop keeps. PIL's filter reads the pixels around a box, so
            # this is the full resize's crop up to float rounding (tested within 1 of 255).
            scale = extent / size[axis]
            box[axis], box[axis + 2], out[axis] = start * scale, (start + crop) * scale, crop
            top, left = (top, 0) if axis == 0 else (0, left)
    resized = np.asarray(Image.fromarray(rgb).resize(tuple(out), Image.Resampling.BILINEAR,
                                                     box=tuple(box)))
    cropped = resized[top:top + crop, left:left + crop].astype(np.float32) / 255.0
    if mean is not None:
        cropped = cropped - mean
    return cropped / std if std is not None else cropped


def preprocess_batch(images: Sequence[np.ndarray]) -> np.ndarray:
    """Several images → ``(N, 224, 224, 3)`` float32, the model's NHWC input."""
    if len(images) == 0:
        raise ShapeMismatchError("imagenet.preprocess_batch got no images: pass at least one")
    return np.stack([preprocess(img) for img in images])


@lru_cache(maxsize=1)
def class_names() -> tuple[str, ...]:
    """The 1000 ImageNet-1k class names, in the index order of the classifier."""
    text = resources.files(__package__).joinpath("data/imagenet_classes.txt").read_text("utf-8")
    names = tuple(line for line in text.splitlines() if line)
    assert len(names) == 1000, len(names)
    return names
