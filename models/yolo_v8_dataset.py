"""A YOLO detection split for training: checked images, cached labels, seeded augmented samples
and the batches' collation.

Building a :class:`DetectionDataset` opens every image (Pillow's header check and ``verify``)
and reads every label file (``models/yolo_v8_data.py``); an image that does not open or is under
10 pixels a side is skipped, a malformed label line dropped, each with one warning. What it
found is cached in a JSON file beside the labels (``labels/train.cache`` for ``labels/train/``,
as ultralytics), keyed on every image's and label file's path, size and modification time: the
next run reads the cache instead (and repeats its warnings); a change to any file rebuilds it.
JSON, not a pickle: a cache file is data, never code.

Samples are drawn from ``numpy.random.default_rng([seed, epoch, index])``: sample ``index`` of
``epoch`` is the same on every run, in any thread, in any order — what makes ``--resume`` and
the threaded loader (``models/image_loader.py``) exact.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from PIL import Image

from .image_decode import decode_rgb, unreadable_reason
from .image_folder import file_problem
from .yolo_v8_augment import (AugmentConfig, Labelled, augment_mosaic, augment_single,
                              letterbox_labelled, load_resized, to_targets)
from .yolo_v8_data import label_path, read_labels

__all__ = ["CACHE_VERSION", "DetectionDataset", "collate"]

CACHE_VERSION = 1
MIN_SIDE = 10  # ultralytics' smallest usable image side


def _fingerprint(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        try:
            st = path.stat()
            digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            digest.update(f"{path}\0missing\n".encode())
    return digest.hexdigest()


def _check_image(path: Path) -> str | None:
    """Why ``path`` cannot be used as an image, or ``None``."""
    missing = file_problem(path)
    if missing:
        return f"{path}: {missing}; image skipped"
    try:
        with Image.open(path) as im:
            im.verify()
        with Image.open(path) as im:
            w, h = im.size
    except Exception as exc:  # Pillow raises many kinds for broken files
        return f"{path}: {unreadable_reason(exc)}; image skipped"
    if min(w, h) < MIN_SIDE:
        return f"{path}: {w}x{h} pixels is under {MIN_SIDE} a side; image skipped"
    return None


class DetectionDataset:
    """The usable images of a split and their labels.

    Args:
        images: image files (``DataConfig.images(split)``). names: class names.
        imgsz: the square training input side. augment: mosaic/affine/HSV/flip (training) or a
            plain letterbox (validation). seed: of every random draw.
        warn: where the warnings go (one string each). cache: the label cache file (the CLI
            passes ``DataConfig.cache_path(split)``, inside the data set); ``True``: beside the
            first image's label folder (ultralytics' place); ``False``: none.

    Attributes: ``images`` (usable, sorted), ``labels`` (their ``ImageLabels``), ``warnings``.
    """

    def __init__(self, images: Sequence[Path], names: Sequence[str], imgsz: int, *,
                 augment: bool = True, seed: int = 0, config: AugmentConfig = AugmentConfig(),
                 warn: Callable[[str], None] = print,
                 cache: "bool | str | os.PathLike" = True) -> None:
        self.names, self.imgsz, self.augment, self.seed = list(names), imgsz, augment, seed
        self.config = config
        images = [Path(p) for p in images]
        entries, self.warnings = self._scan(images, cache, warn)
        for message in self.warnings:
            warn(message)
        if entries and not any(e["classes"] for e in entries):
            # ultralytics warns too: a wrong layout trains on background alone (box loss 0)
            folders = sorted({str(label_path(e["image"]).parent) for e in entries})
            shown = ", ".join(folders[:3]) + (", ..." if len(folders) > 3 else "")
            warn(f"no labels found for any of the {len(entries)} images (looked for "
                 f"<image name>.txt in {shown}: the images/ folder of each image's path "
                 "becomes labels/); the model learns background only")
        self.images = [Path(e["image"]) for e in entries]
        from .yolo_v8_data import ImageLabels

        self.labels = [ImageLabels(np.asarray(e["classes"], np.int64).reshape(-1),
                                   np.asarray(e["boxes"], np.float32).reshape(-1, 4))
                       for e in entries]

    def __len__(self) -> int:
        return len(self.images)

    # -- scanning and the cache ---------------------------------------------------------------

    @staticmethod
    def cache_path(images: Sequence[Path]) -> Path:
        """``labels/<split>.cache`` beside the first image's label folder."""
        return label_path(images[0]).parent.with_suffix(".cache")

    def _scan(self, images: list[Path], cache: "bool | str | os.PathLike",
              warn: Callable[[str], None]) -> tuple[list[dict], list[str]]:
        if not images:
            return [], []
        labels = [label_path(p) for p in images]
        key = _fingerprint(images + labels)
        where = self.cache_path(images) if cache is True else Path(cache) if cache else None
        if cache:
            try:
                found = json.loads(where.read_text(encoding="utf-8"))
                if (found.get("version") == CACHE_VERSION and found.get("hash") == key
                        and found.get("nc") == len(self.names)):
                    return found["entries"], found["warnings"]
            except (OSError, ValueError, AttributeError, KeyError):
                pass  # absent, unreadable or stale: rebuild it
        entries, warnings = [], []
        for image, label in zip(images, labels):
            problem = _check_image(image)
            if problem:
                warnings.append(problem)
                continue
            found, problems = read_labels(label, len(self.names))
            warnings += problems
            entries.append({"image": str(image), "classes": found.classes.tolist(),
                            "boxes": found.boxes.tolist()})
        if cache:
            self._write_cache(where, {"version": CACHE_VERSION, "hash": key,
                                      "nc": len(self.names), "entries": entries,
                                      "warnings": warnings}, warn)
        return entries, warnings

    @staticmethod
    def _write_cache(where: Path, content: dict, warn: Callable[[str], None]) -> None:
        from candle_nn.atomic_write import atomic_write

        try:
            with atomic_write(where) as tmp:
                tmp.write_text(json.dumps(content), encoding="utf-8")
        except OSError as exc:
            warn(f"{where}: cannot write the label cache ({exc.strerror or exc}); "
                 "labels are read again next time")

    # -- samples ------------------------------------------------------------------------------

    def load(self, index: int) -> Labelled:
        """Image ``index`` resized to ``imgsz`` on its long side, boxes in its pixels."""
        path = self.images[index]
        try:
            rgb = decode_rgb(path)
        except Exception as exc:  # it was checked when the split was scanned: changed since
            from candle_nn import CandleNNError

            raise CandleNNError(f"{path}: cannot be read any more ({type(exc).__name__}: {exc});"
                                " fix or remove it and resume") from None
        lab = self.labels[index]
        return load_resized(rgb, lab.classes, lab.boxes, self.imgsz)

    def sample(self, index: int, epoch: int, mosaic: bool) -> tuple[np.ndarray, np.ndarray]:
        """``(image (S, S, 3) uint8, targets (n, 5) class cx cy w h normalised)`` of ``index``
        in ``epoch``; augmented (``mosaic`` or not) when the set augments, else letterboxed."""
        if not self.augment:
            item = letterbox_labelled(self.load(index), self.imgsz)
            return item.image, to_targets(item)
        rng = np.random.default_rng([self.seed, epoch, index])
        if mosaic:
            others = rng.integers(0, len(self), 3)
            parts = [self.load(i) for i in [index, *others.tolist()]]
            item = augment_mosaic(parts, self.imgsz, rng, self.config)
        else:
            item = augment_single(self.load(index), self.imgsz, rng, self.config)
        return item.image, to_targets(item)


def collate(samples: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Samples → ``(images (B, S, S, 3) float32 in [0, 1], targets (n, 6))`` with rows ``image
    index, class, cx, cy, w, h`` (the loss's ``targets``)."""
    images = np.stack([s[0] for s in samples]).astype(np.float32) / np.float32(255)
    rows = [np.concatenate([np.full((len(t), 1), i, np.float32), t], axis=1)
            for i, (_, t) in enumerate(samples)]
    targets = np.concatenate(rows) if rows else np.zeros((0, 6), np.float32)
    return images, targets.reshape(-1, 6)
