"""The one image decoder (``candle_nn_models.image_decode``) on several threads: Pillow's
process-global size limit is never changed (another thread's ``Image.open`` keeps its guard), each
caller's own ``max_pixels`` applies to its own images, and the CLIs, the app, the image folders
and the YOLO datasets all reach it."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
from PIL import Image, ImageOps

from candle_nn_models.scripts.common import ImageInputError, load_rgb
from helpers.cli import bomb_png, noise, png_bytes


def test_decoding_leaves_pillows_global_limit_alone(tmp_path, monkeypatch):
    """While an image decodes, ``Image.MAX_IMAGE_PIXELS`` is what it was: a decode on another
    thread must not find Pillow's bomb guard switched off."""
    seen = []
    transpose = ImageOps.exif_transpose
    monkeypatch.setattr(ImageOps, "exif_transpose", lambda img, **kw: seen.append(
        Image.MAX_IMAGE_PIXELS) or transpose(img, **kw))
    path = tmp_path / "a.png"
    rgb = noise(6, 9)
    path.write_bytes(png_bytes(Image.fromarray(rgb)))
    np.testing.assert_array_equal(load_rgb(path, max_pixels=1000), rgb)
    assert seen == [Image.MAX_IMAGE_PIXELS] and seen[0] is not None


def test_threads_each_get_their_own_limit(tmp_path):
    """Eight threads at once, 25 decodes each, with different limits: a bomb header is refused
    with our message and the caller's limit, small images decode exactly, and Pillow's own guard
    refuses the bomb in a plain ``Image.open`` all along."""
    from candle_nn_models.image_decode import PixelLimitError, decode_rgb

    bomb = bomb_png(20000, 20000)
    rgb = noise(5, 7)
    small = png_bytes(Image.fromarray(rgb))
    failures: list[str] = []
    start = threading.Barrier(8)

    def work(k: int) -> None:
        start.wait()
        for _ in range(25):
            try:
                if k % 4 == 0:  # Pillow's guard, untouched by the others
                    with pytest.raises(Image.DecompressionBombError):
                        Image.open(io.BytesIO(bomb))
                elif k % 4 == 1:
                    limit = 30 + k // 4  # 30 or 31: under the image's 35 pixels
                    with pytest.raises(PixelLimitError, match=f"above the {limit} pixels limit"):
                        decode_rgb(io.BytesIO(small), max_pixels=limit)
                else:
                    np.testing.assert_array_equal(decode_rgb(io.BytesIO(small), 35), rgb)
                    with pytest.raises(PixelLimitError, match="400.0 Mpx"):
                        decode_rgb(io.BytesIO(bomb), max_pixels=10 ** 8 + k)
            except BaseException as exc:  # reported below, from the main thread
                failures.append(f"thread {k}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]


def test_every_reader_decodes_through_it(tmp_path):
    """A PNG stored turned left with EXIF orientation 6 ("rotate 90 CW to view") reads upright
    through the CLIs' ``load_rgb``, the image folders' check and loader, the YOLO dataset's
    ``load`` (which read raw pixels before) and the app's upload, whose limit message names the
    app's option."""
    from candle_nn_models.image_folder import _problem
    from candle_nn_models.image_loader import labelled_images
    from candle_nn_models.scripts.app_server import App
    from candle_nn_models.yolo_v8_data import ImageLabels
    from candle_nn_models.yolo_v8_dataset import DetectionDataset

    upright = noise(8, 6)
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "turned.png"
    Image.fromarray(np.ascontiguousarray(np.rot90(upright, 1))).save(path, exif=exif.tobytes())
    np.testing.assert_array_equal(load_rgb(path), upright)
    assert _problem(path) is None
    np.testing.assert_array_equal(labelled_images([path], np.array([0]), lambda rgb, i: rgb)(0)[0],
                                  upright)
    dataset = DetectionDataset.__new__(DetectionDataset)
    dataset.images, dataset.imgsz = [path], 8  # the long side already: no resize
    dataset.labels = [ImageLabels(np.zeros(0, np.int64), np.zeros((0, 4), np.float32))]
    np.testing.assert_array_equal(dataset.load(0).image, upright)

    def app(max_pixels: int) -> App:
        app = App.__new__(App)
        app.max_pixels, app.decode_slots = max_pixels, threading.BoundedSemaphore(1)
        app.add_image = lambda session, rgb: rgb
        return app

    np.testing.assert_array_equal(app(48).upload(None, path.read_bytes()), upright)
    with pytest.raises(ImageInputError, match="upload: 8x6 is 48 pixels, above the 47 pixels "
                                              "limit .*; start the app with --max-pixels 48"):
        app(47).upload(None, path.read_bytes())
