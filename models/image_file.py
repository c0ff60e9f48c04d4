"""An image file read safely, as every CLI and the task APIs read one: :func:`load_rgb` (the file
checks, then :func:`~candle_nn_models.image_decode.decode_rgb`), the per-image error
:class:`ImageInputError`, and :func:`shown` for printing any path."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np

from candle_nn import ImageError

from candle_nn_models.image_decode import DEFAULT_MAX_PIXELS

__all__ = ["IMAGE_SUFFIXES", "ImageInputError", "load_rgb", "not_regular", "shown"]

IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")


def shown(path: "str | os.PathLike") -> str:
    """``path`` as text that any stream can print: bytes of a file name that are not UTF-8 appear
    as ``\\xNN`` escapes (they would otherwise be lone surrogates, which cannot be encoded)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


class ImageInputError(ImageError):
    """One input image that cannot be used: ``path`` and the ``reason`` (shown as
    ``path: reason``)."""

    def __init__(self, path: "str | os.PathLike", reason: str) -> None:
        self.path, self.reason = Path(path), reason
        super().__init__(f"{shown(path)}: {reason}")


def not_regular(mode: int) -> str | None:
    """``None`` for a regular file, else what it is (never opened: reading a FIFO blocks)."""
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISDIR, "a folder"))
    what = next((name for test, name in kinds if test(mode)), "a special file")
    return f"{what}, not a regular file: skipped"


def load_rgb(path: "str | os.PathLike", max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Read an image file as ``(H, W, 3)`` uint8 RGB (EXIF orientation applied).

    Any Pillow mode is accepted: alpha is dropped, palette/CMYK/1-bit/grey are converted, 16-bit
    (``I;16``, ``I``) is scaled to 8 bits, float (``F``) in ``[0, 1]`` is scaled by 255 (else
    clipped). Raises :class:`ImageInputError` for anything that is not a readable regular image
    file, and for images of more than ``max_pixels`` pixels (checked from the header, before
    decoding: a 69-byte PNG can claim gigapixels).
    """
    from candle_nn_models.image_decode import PixelLimitError, decode_rgb, unreadable_reason

    try:  # O_NONBLOCK: opening a FIFO never waits for a writer; fstat then refuses it
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ImageInputError(path, "image not found") from None
    except OSError as exc:
        raise ImageInputError(path, f"cannot read: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):  # os.fdopen would raise IsADirectoryError
        os.close(fd)
        raise ImageInputError(path, "a folder, not an image file")
    with os.fdopen(fd, "rb") as fh:
        empty = "an empty file (0 bytes)" if not info.st_size else None
        problem = not_regular(info.st_mode) or empty
        if problem:
            raise ImageInputError(path, problem)
        try:
            return decode_rgb(fh, max_pixels)
        except PixelLimitError as exc:
            raise ImageInputError(path, f"{exc}; pass --max-pixels {exc.width * exc.height} to "
                                        "read it anyway") from None
        except Exception as exc:  # Pillow's decoders raise many types on corrupt data
            raise ImageInputError(path, unreadable_reason(exc)) from None
