"""What the ``--image`` arguments name: files, folders (optionally recursive), shell-style globs
that the shell left quoted, and ``-`` for a list of paths on stdin — expanded into one ordered list.

Nothing here opens an image: listing only ``stat``\\ s paths, so a FIFO or a device in a folder is
reported ("not a regular file") instead of blocking a read. A path that cannot be used is kept in
the list with the reason, so the run can report it in order and go on with the others.
"""

from __future__ import annotations

import glob
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Sequence

IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")


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
            matches = sorted(glob.glob(spec, recursive=True))
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
    images, has_subfolders = [], False
    try:
        for root, dirs, files in _walk(folder, recursive):
            dirs.sort()
            has_subfolders = has_subfolders or bool(dirs)
            images.extend(Path(root) / name for name in sorted(files)
                          if Path(name).suffix.lower() in IMAGE_SUFFIXES)
    except OSError as exc:
        yield ImageInput(folder, f"cannot list this folder: {exc.strerror or exc}")
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


def _walk(folder: Path, recursive: bool) -> Iterable[tuple[str, list[str], list[str]]]:
    def fail(exc: OSError) -> None:
        raise exc

    for entry in os.walk(folder, onerror=fail):  # symlinked folders are not followed: no loops
        yield entry
        if not recursive:
            entry[1].clear()


def not_regular(mode: int) -> str | None:
    """``None`` for a regular file, else what it is (never opened: reading a FIFO blocks)."""
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISDIR, "a folder"))
    what = next((name for test, name in kinds if test(mode)), "a special file")
    return f"{what}, not a regular file: skipped"
