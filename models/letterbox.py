"""Letterboxing, as ultralytics' ``LetterBox``: resize keeping the aspect ratio, pad to the size.

Images are ``(H, W, 3)`` uint8 RGB NumPy arrays on the host. The resize reproduces OpenCV's
``cv2.resize(..., interpolation=INTER_LINEAR)`` on uint8 images, which ultralytics uses: half-pixel
centres, two taps per axis, no antialiasing (also when shrinking), 11-bit fixed-point weights,
and the rounding of OpenCV's vectorised vertical pass. It is bit-exact on the reference fixture
(OpenCV computes a row's last few pixels in scalar code, which can round one grey level
differently).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from candle_nn.inputs import check_rgb_image
from candle_nn.pairs import pair

_COEF_BITS = 11  # OpenCV's INTER_RESIZE_COEF_BITS
_COEF_ONE = 1 << _COEF_BITS


def _linear_taps(size_in: int,
                 size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per output index: source indices ``i0``, ``i1`` and their fixed-point weights ``w0``,
    ``w1`` (summing to 2048), by OpenCV's rule ``src = (dst + 0.5) * in / out - 0.5`` in float32,
    clamped to the image."""
    scale = 1.0 / (size_out / size_in)
    src = ((np.arange(size_out) + 0.5) * scale - 0.5).astype(np.float32)
    i0 = np.floor(src).astype(np.intp)
    frac = src - i0
    outside = (i0 < 0) | (i0 >= size_in - 1)
    frac[outside] = 0
    i0 = np.clip(i0, 0, size_in - 1)
    w0 = np.rint((np.float32(1) - frac) * _COEF_ONE).astype(np.int32)
    w1 = np.rint(frac * _COEF_ONE).astype(np.int32)
    return i0, np.minimum(i0 + 1, size_in - 1), w0, w1


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize ``(H, W, C)`` uint8 to ``(height, width, C)`` uint8 as OpenCV's INTER_LINEAR."""
    h, w = image.shape[:2]
    if (h, w) == (height, width):
        return image.copy()
    r0, r1, v0, v1 = _linear_taps(h, height)
    c0, c1, u0, u1 = _linear_taps(w, width)

    def horizontal(rows: np.ndarray) -> np.ndarray:  # exact integers scaled by 2048
        return (rows[:, c0].astype(np.int32) * u0[None, :, None]
                + rows[:, c1].astype(np.int32) * u1[None, :, None])

    # Only the source rows that are read get the horizontal pass (a large photo is never
    # widened to int32 whole). Vertical pass as OpenCV's SIMD code: drop 4 bits, 16-bit high
    # multiply, round by 2 bits.
    top = (v0[:, None, None] * (horizontal(image[r0]) >> 4)) >> 16
    bottom = (v1[:, None, None] * (horizontal(image[r1]) >> 4)) >> 16
    return np.clip((top + bottom + 2) >> 2, 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class Letterbox:
    """A letterboxed image and how to map its coordinates back to the original.

    Attributes:
        image: ``(h, w, 3)`` uint8, the model's input size.
        scale: resize factor, original → letterboxed.
        pad: ``(left, top)`` padding in letterboxed pixels.
        orig_hw: the original image's ``(height, width)``.
    """

    image: np.ndarray
    scale: float
    pad: tuple[int, int]
    orig_hw: tuple[int, int]

    @property
    def input_hw(self) -> tuple[int, int]:
        return int(self.image.shape[0]), int(self.image.shape[1])

    def as_input(self) -> np.ndarray:
        """``(1, h, w, 3)`` float32 in [0, 1]: the model's NHWC input."""
        return (self.image.astype(np.float32) / 255.0)[None]

    @property
    def gains(self) -> tuple[float, float]:
        """``(x, y)`` resize factors of the unpadded image, each side's rounded size over the
        original's (ultralytics' ``scale_boxes``; ``scale`` up to that rounding)."""
        h, w = self.orig_hw
        return max(round(w * self.scale), 1) / w, max(round(h * self.scale), 1) / h

    def to_original(self, xy: np.ndarray) -> np.ndarray:
        """Map ``(..., 2k)`` letterboxed ``x, y, x, y, …`` to original pixels, clipped to the
        image (ultralytics' ``scale_boxes`` / ``scale_coords``: per-axis :attr:`gains`)."""
        xy = np.asarray(xy, dtype=np.float32)
        shape = xy.shape
        xy = (xy.reshape(-1, 2) - np.asarray(self.pad, np.float32)) / np.asarray(self.gains,
                                                                                 np.float32)
        h, w = self.orig_hw
        xy = np.clip(xy, 0, np.asarray([w, h], np.float32))
        return xy.reshape(shape)


def letterbox(image: np.ndarray, size: "int | tuple[int, int]" = 640, *, auto: bool = False,
              stride: int = 32, pad_value: int = 114, scaleup: bool = True) -> Letterbox:
    """Resize ``image`` ``(H, W, 3)`` uint8 to fit ``size`` (``(height, width)`` or a square side)
    keeping its aspect ratio, and pad with ``pad_value``, centred.

    ``auto=False`` pads to exactly ``size``; ``auto=True`` pads only up to the next multiple of
    ``stride`` (ultralytics' minimal "rect" padding). ``scaleup=False`` never enlarges. Rounding
    is ultralytics': ``r = min(h'/h, w'/w)``, unpadded size ``round(w * r) × round(h * r)``,
    padding split ``round(d/2 - 0.1)`` before and ``round(d/2 + 0.1)`` after.
    """
    image = check_rgb_image(image, where="letterbox")
    h, w = image.shape[:2]
    new_h, new_w = pair(size)
    r = min(new_h / h, new_w / w)
    if not scaleup:
        r = min(r, 1.0)
    # At least one pixel: ultralytics' rounding gives 0 (a crash) beyond a 2*size:1 aspect ratio.
    unpad_w, unpad_h = max(1, int(round(w * r))), max(1, int(round(h * r)))
    dw, dh = new_w - unpad_w, new_h - unpad_h
    if auto:
        dw, dh = dw % stride, dh % stride
    dw, dh = dw / 2, dh / 2
    resized = resize_bilinear(image, unpad_h, unpad_w)
    top, bottom = int(round(dh - 0.1)), int(round(dh + 0.1))
    left, right = int(round(dw - 0.1)), int(round(dw + 0.1))
    out = np.full((unpad_h + top + bottom, unpad_w + left + right, 3), pad_value, dtype=np.uint8)
    out[top:top + unpad_h, left:left + unpad_w] = resized
    return Letterbox(out, r, (left, top), (h, w))
