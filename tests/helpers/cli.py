"""Running the model CLIs as a user does (a child process through the console entry point), and
small generated images of every awkward kind for the CLI tests."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

from conftest import ROOT

ENTRY = {"resnet": "resnet", "yolo": "yolo_v8", "sam": "segment_anything", "app": "app"}


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a child CLI: this checkout first on the path."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def cli_command(cli: str, *args) -> list:
    """argv that runs console entry point ``cli`` (resnet, yolo, sam, app) with ``args``."""
    code = (f"import sys; from candle_nn_models.scripts.launch import {ENTRY[cli]} as m; "
            f"sys.argv[0] = {cli!r}; raise SystemExit(m())")
    return [sys.executable, "-c", code, *(os.fsencode(a) if isinstance(a, Path) else str(a)
                                          for a in args)]


def run_cli(cli: str, *args, timeout: float = 180, stdin: bytes | None = None,
            env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run a CLI to completion (``subprocess.TimeoutExpired`` is the hang detector); bytes out."""
    return subprocess.run(cli_command(cli, *args), input=stdin, capture_output=True,
                          timeout=timeout, env=env or cli_env(), cwd=cwd or ROOT)


def png_bytes(image: Image.Image, **options) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG", **options)
    return buf.getvalue()


def bomb_png(width: int = 20000, height: int = 20000) -> bytes:
    """A valid PNG header claiming ``width x height`` RGB pixels, and no data (~60 bytes)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def noise(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def good_images(folder: Path) -> list[Path]:
    """Readable images in every awkward Pillow mode and size; each must be processed (exit 0)."""
    folder.mkdir(parents=True, exist_ok=True)
    rgb = Image.fromarray(noise(40, 60))
    files = {
        "mode_1.png": rgb.convert("1"), "mode_L.png": rgb.convert("L"),
        "mode_LA.png": rgb.convert("LA"), "mode_P.png": rgb.convert("P"),
        "mode_RGBA.png": rgb.convert("RGBA"), "mode_CMYK.jpg": rgb.convert("CMYK"),
        "mode_I16.png": Image.fromarray((np.asarray(rgb.convert("L"), np.uint16) * 257)),
        "mode_I.tif": Image.fromarray(np.asarray(rgb.convert("L"), np.int32) * 257),
        "mode_F.tif": Image.fromarray(np.asarray(rgb.convert("L"), np.float32) / 255),
        "one_pixel.png": Image.fromarray(noise(1, 1)),
        "wide_3000x1.png": Image.fromarray(noise(1, 3000)),
        "tall_1x3000.png": Image.fromarray(noise(3000, 1)),
    }
    paths = []
    for name, image in files.items():
        image.save(folder / name)
        paths.append(folder / name)
    p_transparent = folder / "mode_P_transparency.png"  # Pillow warns when converting these
    palette = rgb.convert("P")
    palette.save(p_transparent, transparency=0)
    paths.append(p_transparent)
    odd_name = folder / os.fsdecode(b"caf\xe9-latin1-name.png")  # not UTF-8
    rgb.save(odd_name)
    paths.append(odd_name)
    return paths


def bad_images(folder: Path, good_jpeg: bytes) -> list[Path]:
    """Files named like images that no CLI can use; each must be reported and skipped."""
    folder.mkdir(parents=True, exist_ok=True)
    png = png_bytes(Image.fromarray(noise(64, 64)))
    contents = {
        "zero_bytes.jpg": b"",
        "text.jpg": b"this is not an image\n",
        "truncated.jpg": good_jpeg[: len(good_jpeg) // 3],
        "truncated.png": png[: len(png) // 2],
        "header_only.png": png[:40],
        "bomb.png": bomb_png(),
        "bomb_wide.png": bomb_png(2**31 - 1, 1),
        "garbage_gif.gif": b"GIF89a" + bytes(range(256)) * 4,
        "random.bmp": b"BM" + np.random.default_rng(1).bytes(500),
        "html.png": b"<html><body>404 not found</body></html>",
    }
    paths = []
    for name, data in contents.items():
        (folder / name).write_bytes(data)
        paths.append(folder / name)
    fifo = folder / "fifo.jpg"
    os.mkfifo(fifo)
    paths.append(fifo)
    return paths
