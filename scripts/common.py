"""Pieces every model CLI shares: image discovery and loading, atomic output files, device
parsing, and the one-clear-line error handling (``error: …`` on stderr, exit status 1)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from candle_nn import CandleNNError, Device, ImageError
from candle_nn.cli import run_main  # noqa: F401  (re-exported: every CLI's entry wrapper)

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def collect_images(specs: Iterable[str]) -> list[Path]:
    """Expand ``--image`` values (files or folders) into a list of image paths, in order.

    A folder contributes its image files (by suffix, sorted, not recursive). A missing path or an
    empty folder raises ImageError.
    """
    found: list[Path] = []
    for spec in specs:
        path = Path(spec)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise ImageError(f"no image files ({', '.join(sorted(IMAGE_SUFFIXES))}) in folder {path}")
            found.extend(files)
        elif path.is_file():
            found.append(path)
        else:
            raise ImageError(f"image not found: {path}")
    if not found:
        raise ImageError("no image given: pass --image PATH (a file or a folder; repeatable)")
    return found


def load_rgb(path: "str | os.PathLike") -> np.ndarray:
    """Read an image file as ``(H, W, 3)`` uint8 RGB (EXIF orientation applied)."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img = ImageOps.exif_transpose(img)
            return np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
    except FileNotFoundError as exc:
        raise ImageError(f"image not found: {path}") from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ImageError(f"{path} is not a readable image ({exc}); use a JPEG or PNG file") from exc


def prepare_out_dir(path: "str | os.PathLike") -> Path:
    """Create ``path`` if needed and check it is a writable folder (CandleNNError otherwise)."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CandleNNError(f"cannot create output folder {out}: {exc.strerror or exc}") from exc
    if not out.is_dir() or not os.access(out, os.W_OK | os.X_OK):
        raise CandleNNError(f"output folder {out} is not writable; pass another --out DIR")
    return out


def save_image_atomic(image, path: "str | os.PathLike") -> Path:
    """Save a PIL image so that ``path`` is either complete or absent, never half-written."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fmt = _pil_format(path)
            image.save(fh, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(exc, OSError):
            raise CandleNNError(f"cannot write {path}: {exc.strerror or exc}") from exc
        raise
    return path


def save_text_atomic(text: str, path: "str | os.PathLike") -> Path:
    """Write ``text`` (UTF-8) so that ``path`` is either complete or absent, never half-written."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(exc, OSError):
            raise CandleNNError(f"cannot write {path}: {exc.strerror or exc}") from exc
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _pil_format(path: Path) -> str:
    return {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP",
            ".webp": "WEBP"}.get(path.suffix.lower(), "PNG")


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device cpu|gpu|gpu:N`` (default: GPU when MLX has one, else CPU) and ``--verbose``."""
    parser.add_argument("--device", default=None,
                        help="cpu, gpu or gpu:N (default: the GPU when MLX has one, else the CPU)")
    parser.add_argument("--verbose", action="store_true",
                        help="print the MLX version, devices, CPU BLAS and float32 precision "
                             "in use (to stderr)")
    parser.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                        help="run the model under mx.compile (auto, the default: on GPUs, where "
                             "it is faster; off on the CPU, where it is slower)")


def compile_choice(choice: str) -> bool | None:
    """``--compile`` as :meth:`candle_nn.Module.set_compiled`'s argument (``auto`` → ``None``)."""
    return {"auto": None, "on": True, "off": False}[choice]


def parse_device(spec: str | None, verbose: bool = False) -> Device:
    """The device named on the command line (DeviceUnavailableError when absent); with
    ``verbose``, the runtime summary (``candle_nn.info()``) goes to stderr first."""
    if verbose:
        from candle_nn import info

        print(info(), file=sys.stderr)
    return Device.default() if spec is None else Device.parse(spec)
