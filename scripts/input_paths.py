"""What the ``--image`` arguments name: files, folders (optionally recursive), shell-style globs
that the shell left quoted, and ``-`` for a list of paths on stdin — expanded into one ordered list.

Nothing here opens an image: listing only ``stat``\\ s paths, so a FIFO or a device in a folder is
reported ("not a regular file") instead of blocking a read. A path that cannot be used is kept in
the list with the reason, so the run can report it in order and go on with the others; a
subfolder that cannot be listed under ``--recursive`` is one such entry, and its siblings are still
taken. Files this project wrote (listed in a run folder's ``.candle-nn-outputs.json``, see
:mod:`candle_nn_models.scripts.outputs`) and its staging files are never taken from a folder or a
glob, so an output folder inside an input folder is not read back as input.
"""

from __future__ import annotations

import glob
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Sequence

from candle_nn.atomic_write import is_staging
from candle_nn_models.image_file import IMAGE_SUFFIXES, not_regular
from candle_nn_models.scripts.run_manifest import MANIFEST, read_manifest

@dataclass(frozen=True)
class ImageInput:
    """One image to process, or (``error`` set) one input that cannot be, and why."""

    path: Path
    error: str | None = None


def expand_image_args(specs: Sequence[str], *, recursive: bool = False,
                      stdin: BinaryIO | None = None) -> list[ImageInput]:
    """``--image`` values → the images they name, in order (duplicates kept).

    Each value is a file; a folder (its files with an image suffix, sorted; with ``recursive``
    also those of its subfolders); a glob pattern such as ``'photos/*.jpg'`` (``**`` spans
    folders) when no file has that literal name; or ``-``: one path per line read from
    ``stdin`` (default ``sys.stdin``; bytes, so any file name works), each expanded the same way.
    """
    found: list[ImageInput] = []
    for spec in specs:
        if spec == "-":
            source = stdin if stdin is not None else sys.stdin.buffer
            for line in source.read().splitlines():
                name = os.fsdecode(line.strip())
                if name:
                    found.extend(_expand_one(name, recursive))
        else:
            found.extend(_expand_one(spec, recursive))
    return found


def _expand_one(spec: str, recursive: bool) -> Iterator[ImageInput]:
    path = Path(spec)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if glob.has_magic(spec):
            matches = [m for m in sorted(glob.glob(spec, recursive=True))
                       if Path(m).name not in _written_here(Path(m).parent)
                       and not is_staging(Path(m).name)]
            if not matches:
                yield ImageInput(path, "no file matches this pattern")
            for match in matches:
                yield from _expand_one(match, recursive)
        else:
            yield ImageInput(path, "image not found")
        return
    except OSError as exc:
        yield ImageInput(path, f"cannot read: {exc.strerror or exc}")
        return
    if stat.S_ISDIR(mode):
        yield from _folder(path, recursive)
    else:
        yield ImageInput(path, not_regular(mode))


def _folder(folder: Path, recursive: bool) -> Iterator[ImageInput]:
    images, has_subfolders, unlisted = [], False, []
    try:
        for root, dirs, files in _walk(folder, recursive, unlisted):
            dirs.sort()
            has_subfolders = has_subfolders or bool(dirs)
            written = _written_here(Path(root))
            images.extend(Path(root) / name for name in sorted(files)
                          if Path(name).suffix.lower() in IMAGE_SUFFIXES
                          and not is_staging(name) and name not in written)
    except OSError as exc:
        yield ImageInput(folder, f"cannot list this folder: {exc.strerror or exc}")
        return
    for path, reason in unlisted:  # subfolders only: the others are taken
        yield ImageInput(path, f"cannot list this subfolder: {reason}; skipped")
    if not images and unlisted:
        return
    if not images:
        hint = "; pass --recursive to look in its subfolders" if has_subfolders else ""
        suffixes = ", ".join(IMAGE_SUFFIXES)
        yield ImageInput(folder, f"no image files ({suffixes}) in this folder{hint}")
    for image in images:
        try:
            yield ImageInput(image, not_regular(image.stat().st_mode))
        except OSError as exc:  # e.g. a dangling symlink
            yield ImageInput(image, f"cannot read: {exc.strerror or exc}")


def _walk(folder: Path, recursive: bool, unlisted: list[tuple[Path, str]],
          ) -> Iterable[tuple[str, list[str], list[str]]]:
    """``os.walk`` of ``folder`` (not following symlinks: no loops). The folder itself failing to
    list raises; a subfolder failing is appended to ``unlisted`` (path, reason) and passed over.
    """
    def fail(exc: OSError) -> None:
        if Path(exc.filename or folder) == folder:
            raise exc
        unlisted.append((Path(exc.filename), exc.strerror or str(exc)))

    for entry in os.walk(folder, onerror=fail):
        yield entry
        if not recursive:
            entry[1].clear()


def _written_here(folder: Path) -> set[str]:
    """Names of the files in ``folder`` that this project wrote, per the file list of the run
    folder it is in (itself or up to three levels up: ``crops/<class>/``)."""
    written: set[str] = set()
    for depth, root in enumerate([folder, *list(folder.parents)[:3]]):
        if (root / MANIFEST).is_file():
            prefix = folder.relative_to(root).as_posix() if depth else ""
            for rel in read_manifest(root):
                head, _, name = rel.rpartition("/")
                if head == (prefix if prefix != "." else ""):
                    written.add(name)
    return written
