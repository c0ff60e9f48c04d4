"""with_reference_vjp: a kernel's forward with the VJP of the same math in MLX ops (MLX's custom
kernels have none). A stand-in kernel whose own gradient is zero (``stop_gradient``) proves the
gradient comes from the reference, eagerly and under ``mx.compile``."""

from __future__ import annotations

import numpy as np

import candle_nn  # noqa: F401  (import-time policy before mlx)
import mlx.core as mx
from candle_nn.custom_vjp import with_reference_vjp


def test_gradient_is_the_references():
    x = mx.array([1.0, -2.0, 3.0])
    w = mx.array([4.0, 5.0, -6.0])
    f = with_reference_vjp(lambda x, w: mx.stop_gradient(x * w + 1.0), lambda x, w: x * w + 1.0)
    assert np.array_equal(np.array(f(x, w)), np.array(x * w + 1.0))
    gx, gw = mx.grad(lambda x, w: (f(x, w) ** 2).sum(), argnums=(0, 1))(x, w)
    y = np.array(x * w + 1.0)
    assert np.allclose(np.array(gx), 2 * y * np.array(w))
    assert np.allclose(np.array(gw), 2 * y * np.array(x))
    compiled = mx.compile(mx.grad(lambda x, w: (f(x, w) ** 2).sum()))
    assert np.allclose(np.array(compiled(x, w)), 2 * y * np.array(w))


def test_one_input():
    g = with_reference_vjp(lambda x: mx.stop_gradient(mx.exp(x)), mx.exp)
    x = mx.array([[0.0, 1.0], [2.0, -1.0]])
    assert np.allclose(np.array(mx.grad(lambda x: g(x).sum())(x)), np.exp(np.array(x)))
