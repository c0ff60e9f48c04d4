"""Detection data sets as ultralytics users keep them: a ``data.yaml`` over ``images/`` folders
with YOLO-format ``labels/*.txt`` beside them.

``data.yaml``::

    path: /data/shapes        # the data set's root (relative: to the yaml's folder; default it)
    train: images/train       # a folder of images (searched recursively), a .txt list of image
    val: images/val           #   paths (relative to the list's folder), one image, or a list
    names: [circle, square]   # or {0: circle, 1: square}

Each image ``.../images/.../x.jpg`` has its labels in ``.../labels/.../x.txt`` (the last
``images`` folder of the path swapped for ``labels``): one box a line, ``class cx cy w h``
normalised to the image's width and height, or a polygon ``class x1 y1 x2 y2 ...`` (its bounding
box is used). An image without a label file has no objects. A malformed line is skipped with one
warning naming the file and line; a repeated line is dropped with one warning.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["IMAGE_SUFFIXES", "DataConfig", "ImageLabels", "label_path", "read_labels"]

IMAGE_SUFFIXES = {".bmp", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp"}


class DataError(ValueError):
    """A data.yaml or data set that cannot be used (the message says what and where)."""


@dataclass
class DataConfig:
    """A parsed ``data.yaml``: ``root`` folder, the ``splits`` it names (``train``, ``val``,
    ``test``: lists of entries as written) and the class ``names``."""

    path: Path
    root: Path
    splits: dict[str, list[str]]
    names: list[str]

    @classmethod
    def load(cls, path: "str | os.PathLike") -> "DataConfig":
        import yaml

        path = Path(path)
        expected = "(pass the data set's YAML: path, train, val, names)"
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DataError(f"{path}: data file not found") from None
        except IsADirectoryError:
            raise DataError(f"{path}: is a folder, not a data.yaml file {expected}") from None
        except UnicodeDecodeError:
            raise DataError(f"{path}: not a text (YAML) file {expected}") from None
        except OSError as exc:
            raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise DataError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise DataError(f"{path}: expected a mapping with path, train, val and names")
        root = Path(str(data.get("path") or "."))
        root = root if root.is_absolute() else path.parent / root
        names = data.get("names")
        if isinstance(names, dict):
            try:
                ids = sorted(int(k) for k in names)
            except (TypeError, ValueError):
                ids = []
            if ids != list(range(len(names))):
                raise DataError(f"{path}: names keys must be the class ids 0..{len(names) - 1}")
            names = [str(names[k] if k in names else names[str(k)]) for k in ids]
        if not isinstance(names, list) or not names:
            raise DataError(f"{path}: 'names' must list the class names (a list or a mapping "
                            "from class id to name)")
        if "nc" in data and data["nc"] != len(names):
            raise DataError(f"{path}: nc is {data['nc']} but {len(names)} names are given")
        splits = {}
        for split in ("train", "val", "test"):
            entry = data.get(split)
            if entry:
                splits[split] = [str(e) for e in (entry if isinstance(entry, list) else [entry])]
        return cls(path, root, splits, [str(n) for n in names])

    def images(self, split: str) -> list[Path]:
        """The split's image files, sorted (DataError when the split is absent, an entry does
        not exist, or there are no images)."""
        if split not in self.splits:
            raise DataError(f"{self.path}: no '{split}' entry (it names "
                            f"{', '.join(self.splits) or 'no split'})")
        found: list[Path] = []
        for entry in self.splits[split]:
            where = Path(entry) if Path(entry).is_absolute() else self.root / entry
            if where.is_dir():
                found += [p for p in where.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES
                          and p.is_file()]
            elif where.suffix == ".txt" and where.is_file():
                for line in where.read_text(encoding="utf-8").splitlines():
                    if line.strip():
                        p = Path(line.strip())
                        found.append(p if p.is_absolute() else where.parent / p)
            elif where.is_file():
                found.append(where)
            else:
                raise DataError(f"{self.path}: {split} entry '{entry}' not found (looked for "
                                f"{where})")
        if not found:
            raise DataError(f"{self.path}: no images in {split} ({', '.join(self.splits[split])})")
        return sorted(set(found))


    def cache_path(self, split: str) -> Path:
        """Where the label cache of ``split`` goes, always inside the data set: for a split that
        is one image folder, beside its label folder (``labels/train.cache`` for
        ``images/train``, as ultralytics); for one list file, beside it (``train.cache`` for
        ``train.txt``); else ``<path>/<split>.cache``."""
        entries = self.splits.get(split, [])
        if len(entries) == 1:
            where = Path(entries[0]) if Path(entries[0]).is_absolute() else self.root / entries[0]
            if where.is_dir():
                return label_path(where / "image").parent.with_suffix(".cache")
            if where.suffix == ".txt":
                return where.with_suffix(".cache")
        return self.root / f"{split}.cache"


def label_path(image: "str | os.PathLike") -> Path:
    """The label file of an image: the last ``images`` folder in its path becomes ``labels``,
    the suffix ``.txt``."""
    parts = list(Path(image).parts)
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            break
    return Path(*parts).with_suffix(".txt")


@dataclass
class ImageLabels:
    """One image's boxes: ``classes`` ``(n,)`` int64, ``boxes`` ``(n, 4)`` float32 ``cx, cy, w,
    h`` normalised to the image."""

    classes: np.ndarray
    boxes: np.ndarray

    def xyxy(self, width: float, height: float) -> np.ndarray:
        """The boxes as ``x1, y1, x2, y2`` pixels of a ``width`` x ``height`` image."""
        xy, half = self.boxes[:, :2], self.boxes[:, 2:] / 2
        return np.concatenate([xy - half, xy + half], axis=1) * np.float32(
            [width, height, width, height])


def read_labels(path: "str | os.PathLike", num_classes: int) -> tuple[ImageLabels, list[str]]:
    """Parse a YOLO label file; returns the labels and one warning per skipped line (a missing
    file: no objects, no warning)."""
    path = Path(path)
    warnings: list[str] = []
    rows: list[list[float]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError) as exc:
        return _empty(), [f"{path}: cannot read the labels ({exc}); image taken as unlabelled"]
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        row, problem = _parse_line(fields, num_classes)
        if problem:
            warnings.append(f"{path}:{number}: {problem}; line skipped")
        elif row in rows:
            warnings.append(f"{path}:{number}: repeats an earlier line; line skipped")
        else:
            rows.append(row)
    if not rows:
        return _empty(), warnings
    table = np.asarray(rows, dtype=np.float32)
    return ImageLabels(table[:, 0].astype(np.int64), table[:, 1:]), warnings


def _empty() -> ImageLabels:
    return ImageLabels(np.zeros(0, np.int64), np.zeros((0, 4), np.float32))


def _parse_line(fields: list[str], num_classes: int) -> tuple[list[float], str | None]:
    try:
        values = [float(f) for f in fields]
    except ValueError:
        return [], "not numbers"
    if not np.isfinite(values).all():
        return [], "not finite numbers"
    cls = values[0]
    if cls != int(cls) or not 0 <= cls < num_classes:
        return [], f"class {fields[0]} is not one of 0..{num_classes - 1}"
    coords = values[1:]
    if len(coords) == 4:
        cx, cy, w, h = coords
    elif len(coords) >= 6 and len(coords) % 2 == 0:  # a polygon: its bounding box
        xs, ys = coords[0::2], coords[1::2]
        cx, cy = (min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2
        w, h = max(xs) - min(xs), max(ys) - min(ys)
        coords = [*xs, *ys]
    else:
        return [], f"{len(fields)} values: expected 'class cx cy w h' or a polygon"
    if min(coords) < 0 or max(coords) > 1:
        return [], "coordinates outside 0..1 (not normalised to the image?)"
    if w <= 0 or h <= 0:
        return [], "a box of zero width or height"
    return [cls, cx, cy, w, h], None
