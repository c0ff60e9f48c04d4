"""Labelled images in torchvision's ImageFolder layout, split into training and validation sets.

::

    DIR/cat/001.jpg  DIR/dog/002.png ...            one subfolder per class, split by val_fraction
    DIR/train/cat/...  DIR/val/cat/...              or an explicit train/ + val/ split
    DIR/train/cat/...                               (train/ alone: split by val_fraction)

Class names are the subfolder names, sorted (index order of the classifier). Files with an image
extension that Pillow cannot decode are reported in :attr:`ImageFolder.skipped` and left out;
other files are ignored, as torchvision does. Images are verified once, when the folder is read,
by decoding them (JPEGs at reduced scale, Pillow's draft mode) on a thread pool.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from candle_nn import CandleNNError
from candle_nn_models.image_decode import decode_rgb, unreadable_reason

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
                    ".gif")


class DatasetError(CandleNNError):
    """A data folder that cannot be trained on (no classes, an empty class, a bad split)."""


def file_problem(path: Path) -> str | None:
    """Why ``path`` is not a file to open as an image (``None`` when it is a regular file):
    ``not found``, or ``not a regular file`` (a FIFO would block the reader: never opened)."""
    if not path.exists():
        return "not found"
    if not path.is_file():
        return "not a regular file"
    return None


def _problem(path: Path) -> str | None:
    """Why ``path`` cannot be used (``None`` when it decodes)."""
    missing = file_problem(path)
    if missing:
        return missing
    try:
        decode_rgb(path, draft=32)
    except Exception as exc:  # Pillow raises many types on corrupt data
        return unreadable_reason(exc)
    return None


@dataclass(frozen=True)
class Split:
    """One set of labelled images: ``paths[i]`` has class index ``labels[i]``."""

    paths: list[Path]
    labels: np.ndarray  # (N,) int32

    def __len__(self) -> int:
        return len(self.paths)


@dataclass
class ImageFolder:
    """A data folder read into a training and a validation :class:`Split`."""

    root: Path
    classes: list[str]
    train: Split
    val: Split
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # (file, reason)

    @classmethod
    def read(cls, root: "str | os.PathLike", val_fraction: float = 0.2, seed: int = 0,
             workers: int = 8) -> "ImageFolder":
        """Read ``root``: a ``train/`` + ``val/`` split when both subfolders exist, else every
        class's images split ``val_fraction`` for validation (per class, seeded by ``seed``)."""
        root = Path(root)
        if not root.is_dir():
            raise DatasetError(f"data folder {root} not found (or not a folder); pass a folder "
                               "with one subfolder of images per class")
        train_dir, val_dir = root / "train", root / "val"
        explicit = train_dir.is_dir() and val_dir.is_dir()
        if train_dir.is_dir() and not explicit:
            root = train_dir
        classes = _class_folders(train_dir if explicit else root)
        if explicit:
            extra = sorted(set(_class_folders(val_dir, required=False)) - set(classes))
            if extra:
                raise DatasetError(f"{val_dir} has classes that {train_dir} lacks: "
                                   f"{', '.join(extra)}; give both the same class subfolders")
        elif not 0.0 < val_fraction < 1.0:
            raise DatasetError(f"--val-fraction must be between 0 and 1 (exclusive), not "
                               f"{val_fraction}: {root} has no train/ + val/ split to use instead")
        top = [train_dir, val_dir] if explicit else [root]
        files = {(t, c): _image_files(t / c) for t in top for c in classes}
        candidates = [p for group in files.values() for p in group]
        with ThreadPoolExecutor(max(1, workers)) as pool:
            problems = dict(zip(candidates, pool.map(_problem, candidates)))
        skipped = [(p, problems[p]) for p in candidates if problems[p] is not None]
        good = {k: [p for p in v if problems[p] is None] for k, v in files.items()}
        for (t, c), paths in good.items():
            if not paths and (t != val_dir):
                raise DatasetError(f"class folder {t / c} has no readable images "
                                   f"({', '.join(IMAGE_EXTENSIONS)}); add some or remove it")
        if explicit:
            train = _split([(p, i) for i, c in enumerate(classes) for p in good[train_dir, c]])
            val = _split([(p, i) for i, c in enumerate(classes) for p in good[val_dir, c]])
            if not len(val):
                raise DatasetError(f"{val_dir} has no readable images")
        else:
            rng = np.random.default_rng(seed)
            tr, va = [], []
            for i, c in enumerate(classes):
                paths = good[root, c]
                order = rng.permutation(len(paths))
                n_val = min(len(paths) - 1, max(1, round(len(paths) * val_fraction)))
                va += [(paths[k], i) for k in sorted(order[:n_val])]
                tr += [(paths[k], i) for k in sorted(order[n_val:])]
            train, val = _split(tr), _split(va)
            if not len(val):
                raise DatasetError(f"no validation images: every class of {root} has a single "
                                   "image, which it keeps for training; add images, or a val/ "
                                   "folder beside a train/ folder")
        return cls(root, classes, train, val, skipped)


def _class_folders(folder: Path, required: bool = True) -> list[str]:
    names = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    for name in names:
        if "\n" in name or "\r" in name:  # labels.txt holds one class name a line
            raise DatasetError(f"class folder {folder / name!r} has a line break in its name, "
                               "which labels.txt (one class name a line) cannot hold; rename it")
    if required and len(names) < 2:
        found = f"only {names[0]!r}" if names else "none"
        raise DatasetError(f"{folder} needs at least two class subfolders (found {found}); lay "
                           "it out as DIR/<class>/<image> or DIR/train/<class>/<image> + "
                           "DIR/val/<class>/<image>")
    return names


def _image_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*")
                  if p.suffix.lower() in IMAGE_EXTENSIONS and not p.is_dir())


def _split(items: list[tuple[Path, int]]) -> Split:
    return Split([p for p, _ in items], np.array([i for _, i in items], dtype=np.int32))
