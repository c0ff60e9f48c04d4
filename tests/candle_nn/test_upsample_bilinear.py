"""candle_nn.upsample_bilinear2d against PyTorch's bilinear rule (align_corners=False, no
antialias), written out independently in NumPy float64."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import candle_nn as cn


def bilinear_reference(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """NHWC bilinear resize, one output pixel at a time (PyTorch's formula)."""
    n, h, w, c = x.shape
    out = np.zeros((n, height, width, c))

    def taps(dst: int, size_in: int, size_out: int) -> tuple[int, int, float]:
        src = max((dst + 0.5) * size_in / size_out - 0.5, 0.0)
        i0 = min(int(np.floor(src)), size_in - 1)
        return i0, min(i0 + 1, size_in - 1), src - i0

    for oy in range(height):
        y0, y1, ly = taps(oy, h, height)
        for ox in range(width):
            x0, x1, lx = taps(ox, w, width)
            out[:, oy, ox] = ((1 - ly) * ((1 - lx) * x[:, y0, x0] + lx * x[:, y0, x1])
                              + ly * ((1 - lx) * x[:, y1, x0] + lx * x[:, y1, x1]))
    return out


def test_known_values_2x2_to_4x4():
    # torch.nn.functional.interpolate(arange(4).view(1,1,2,2), (4,4), mode="bilinear")
    x = mx.arange(4, dtype=mx.float32).reshape(1, 2, 2, 1)
    expected = np.array([[0.0, 0.25, 0.75, 1.0], [0.5, 0.75, 1.25, 1.5],
                         [1.5, 1.75, 2.25, 2.5], [2.0, 2.25, 2.75, 3.0]])
    np.testing.assert_allclose(np.array(cn.upsample_bilinear2d(x, 4, 4))[0, :, :, 0], expected,
                               atol=1e-6)


@pytest.mark.parametrize("shape,size", [
    ((1, 8, 8, 3), (32, 32)),      # 4x up (SAM's 256 -> 1024 step)
    ((2, 13, 17, 2), (9, 11)),     # down, non-integer (SAM's crop -> original size step)
    ((1, 7, 10, 1), (15, 6)),      # up in one axis, down in the other
    ((1, 5, 5, 4), (5, 5)),        # identity
])
def test_matches_numpy_reference(shape, size, device):
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    with mx.stream(device.stream):
        y = np.array(cn.upsample_bilinear2d(mx.array(x), *size))
    ref = bilinear_reference(x.astype(np.float64), *size)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5)
