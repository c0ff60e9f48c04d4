"""The torchvision ``Compose`` ultralytics' classification trainer stores in ``model.transforms``
(``classify_transforms``: ``Resize(size)``, ``CenterCrop(size)``, ``ToTensor()``,
``Normalize(mean, std)``), without torchvision (not installable beside the CPU torch): stand-in
classes pickled under torchvision's module and class names with the state torchvision's own
objects pickle (``nn.Module`` transforms, the ``InterpolationMode`` Enum by value), registered
in ``sys.modules`` only while the checkpoint is saved. :func:`reference_transform` computes what
those transforms do to an image, in the test, with Pillow and NumPy.
"""

from __future__ import annotations

import enum
import sys
import types
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np
import torch
from PIL import Image

_MODULES = ("torchvision", "torchvision.transforms", "torchvision.transforms.transforms",
            "torchvision.transforms.functional")


def _named(cls: type, module: str) -> type:
    cls.__module__, cls.__qualname__ = module, cls.__name__
    return cls


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"


class Compose:
    def __init__(self, transforms: list) -> None:
        self.transforms = transforms


class ToTensor:
    pass


class Resize(torch.nn.Module):
    def __init__(self, size, interpolation=InterpolationMode.BILINEAR) -> None:
        super().__init__()
        self.size, self.interpolation, self.max_size, self.antialias = \
            size, interpolation, None, True


class CenterCrop(torch.nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = (size, size)  # torchvision's _setup_size


class Normalize(torch.nn.Module):
    def __init__(self, mean, std) -> None:
        super().__init__()
        self.mean, self.std, self.inplace = mean, std, False


_named(InterpolationMode, "torchvision.transforms.functional")
for _cls in (Compose, ToTensor, Resize, CenterCrop, Normalize):
    _named(_cls, "torchvision.transforms.transforms")


def classify_transforms(size: int, mean: Sequence[float] = (0.0, 0.0, 0.0),
                        std: Sequence[float] = (1.0, 1.0, 1.0),
                        interpolation: InterpolationMode = InterpolationMode.BILINEAR
                        ) -> Compose:
    """ultralytics' ``classify_transforms(size, mean, std)`` (a square size) as stand-ins."""
    return Compose([Resize(size, interpolation), CenterCrop(size), ToTensor(),
                    Normalize(torch.tensor(mean), torch.tensor(std))])


@contextmanager
def torchvision_registered() -> Iterator[None]:
    """The stand-ins importable under torchvision's names while the block runs (for pickle)."""
    saved = {name: sys.modules.get(name) for name in _MODULES}
    for name in _MODULES:
        sys.modules[name] = types.ModuleType(name)
    functional = sys.modules["torchvision.transforms.functional"]
    transforms = sys.modules["torchvision.transforms.transforms"]
    functional.InterpolationMode = InterpolationMode
    for cls in (Compose, ToTensor, Resize, CenterCrop, Normalize):
        setattr(transforms, cls.__name__, cls)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def reference_transform(rgb: np.ndarray, size: int, mean: Sequence[float] = (0.0, 0.0, 0.0),
                        std: Sequence[float] = (1.0, 1.0, 1.0)) -> np.ndarray:
    """torchvision's ``Resize(size)`` (shorter side, the other truncated; bilinear, antialiased
    as on a PIL image), ``CenterCrop(size)``, ``ToTensor``, ``Normalize`` on ``(H, W, 3)`` uint8:
    float32 ``(size, size, 3)``."""
    h, w = rgb.shape[:2]
    new = (int(size * w / h), size) if h <= w else (size, int(size * h / w))
    resized = np.asarray(Image.fromarray(rgb).resize(new, Image.Resampling.BILINEAR))
    top, left = int(round((new[1] - size) / 2.0)), int(round((new[0] - size) / 2.0))
    crop = resized[top:top + size, left:left + size].astype(np.float32) / 255.0
    return ((crop - np.float32(mean)) / np.float32(std)).astype(np.float32)
