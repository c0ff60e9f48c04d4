"""The one image decoder: a file (path or open binary file) as ``(H, W, 3)`` uint8 RGB, with its
pixel count checked from the header before any decoding. The CLIs (``scripts/common.load_rgb``,
which adds the file checks and the messages), the app's uploads, the classifier's image folders
and the YOLO datasets all decode through :func:`decode_rgb`.

Safe on many threads at once: Pillow's process-global ``Image.MAX_IMAGE_PIXELS`` is never
changed; the header is read through Pillow's format registry (what ``Image.open`` does, without
its own size check) and the size is checked here against the caller's limit. Pillow's warnings
(palette transparency, odd EXIF, a size above its own threshold) are ignored once for the
process, when this module is imported, rather than toggled around each decode (a
``warnings.catch_warnings`` block is process-global too).
"""

from __future__ import annotations

import os
import struct
import warnings
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from candle_nn import ImageError

DEFAULT_MAX_PIXELS = 2 * 89_478_485  # Pillow's own refusal threshold (Image.MAX_IMAGE_PIXELS x 2)

# Pillow's warnings say nothing a caller acts on: the size is checked here, and an image that
# cannot be used raises. Set once, never toggled (see the module's docstring).
warnings.filterwarnings("ignore", module=r"PIL\.")


class PixelLimitError(ImageError):
    """An image whose header claims more than ``max_pixels`` pixels (a decompression bomb guard:
    a 69-byte PNG can claim gigapixels). ``width``, ``height``, ``max_pixels``."""

    def __init__(self, width: int, height: int, max_pixels: int) -> None:
        self.width, self.height, self.max_pixels = width, height, max_pixels
        super().__init__(f"{width}x{height} is {_pixels(width * height)}, above the "
                         f"{_pixels(max_pixels)} limit that guards against decompression bombs")


def decode_rgb(source: "str | os.PathLike | BinaryIO", max_pixels: int | None = DEFAULT_MAX_PIXELS,
               draft: int | None = None) -> np.ndarray:
    """An image file as uint8 RGB ``(H, W, 3)``, EXIF orientation applied.

    Any Pillow mode is accepted: alpha is dropped, palette/CMYK/1-bit/grey are converted, 16-bit
    (``I;16``, ``I``) is scaled to 8 bits, float (``F``) in ``[0, 1]`` is scaled by 255 (else
    clipped). ``max_pixels``: :class:`PixelLimitError` above it, from the header (``None``: no
    limit). ``draft``: let a JPEG decode at a reduced scale no smaller than ``draft`` pixels a
    side (faster; for checks). Anything else unreadable raises what Pillow raises (callers word
    it with :func:`unreadable_reason`).
    """
    with _open(source) as img:
        width, height = img.size
        if max_pixels is not None and width * height > max_pixels:
            raise PixelLimitError(width, height, max_pixels)
        if draft is not None:
            img.draft("RGB", (draft, draft))
        return _to_rgb(ImageOps.exif_transpose(img))


def unreadable_reason(exc: BaseException) -> str:
    """Why Pillow could not decode a file, in the words every CLI and trainer uses (the file's
    name is the caller's to add)."""
    if isinstance(exc, PixelLimitError):
        return str(exc)
    if isinstance(exc, UnidentifiedImageError):
        return "not a readable image (not a format Pillow recognises); use a JPEG or PNG file"
    if isinstance(exc, MemoryError):
        return "not enough memory to decode this image"
    return f"not a readable image: corrupt or truncated data ({type(exc).__name__}: {exc})"


def _open(source: "str | os.PathLike | BinaryIO") -> Image.Image:
    """``Image.open(source)`` without its size check (which reads ``Image.MAX_IMAGE_PIXELS``):
    the first registered format whose check accepts the header, tried as Pillow tries them (the
    common plugins first, then all)."""
    path = isinstance(source, (str, os.PathLike))
    fh = open(source, "rb") if path else source
    try:
        fh.seek(0)
        prefix = fh.read(16)
        tried: set[str] = set()
        for loader in (Image.preinit, Image.init):
            loader()
            for name in [f for f in Image.ID if f not in tried]:
                tried.add(name)
                factory, accept = Image.OPEN[name]
                try:  # Pillow's own loop: these mean "not this format"
                    result = not accept or accept(prefix)
                    if not result or isinstance(result, str):
                        continue
                    fh.seek(0)
                    img = factory(fh, os.fspath(source) if path else "")
                except (SyntaxError, IndexError, TypeError, struct.error):
                    continue
                img._exclusive_fp = path  # as Image.open: closing the image closes our file
                return img
    except BaseException:
        if path:
            fh.close()
        raise
    if path:
        fh.close()
    raise UnidentifiedImageError("cannot identify image file")


def _pixels(count: int) -> str:
    return f"{count / 1e6:.1f} Mpx" if count >= 100_000 else f"{count} pixels"


def _to_rgb(img: Image.Image) -> np.ndarray:
    if img.mode.startswith("I") or img.mode == "F":  # I;16*, I (16-bit PNG/TIFF), F (float)
        values = np.nan_to_num(np.asarray(img, dtype=np.float64), nan=0.0)
        if img.mode != "F":
            values = values / 257.0  # 0..65535 -> 0..255
        elif values.size and values.max() <= 1.0:
            values = values * 255.0
        grey = np.clip(np.rint(values), 0, 255).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=2)
    return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
