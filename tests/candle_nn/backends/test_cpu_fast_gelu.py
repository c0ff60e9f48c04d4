"""The CPU fast exact-erf GELU (backends/cpu/gelu_poly.py) against float64 ``erf``/GELU (PyTorch)
and the plain MLX op; and the switch that turns it off."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
import torch

import candle_nn as cn
from candle_nn.backends.cpu import gelu_poly as cpu_fast_gelu

ERF_RTOL = 1e-6  # the accuracy kept from exact erf (a rational approximation failed this)


def _grid() -> np.ndarray:
    """A dense grid over [-8, 8], tiny and huge magnitudes of both signs, the branch edges."""
    edges = np.array([1.0, 4.0, 1.0 * math.sqrt(2.0), 4.0 * math.sqrt(2.0)])
    edges = np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, 10)])
    tiny = np.logspace(-38, 1, 4001)
    return np.concatenate([np.linspace(-8, 8, 400_001), tiny, -tiny, edges, -edges,
                           [0.0, 1e4, -1e4, 3e38, -3e38]]).astype(np.float32)


def _exact_erf(z: np.ndarray) -> np.ndarray:
    return torch.special.erf(torch.from_numpy(z.astype(np.float64))).numpy()


def _exact_gelu(x: np.ndarray) -> np.ndarray:
    return torch.nn.functional.gelu(torch.from_numpy(x.astype(np.float64))).numpy()


def test_erf_within_1e6_relative_of_exact():
    z = _grid()
    with mx.stream(mx.cpu):
        ours = np.array(cpu_fast_gelu.erf_f32(mx.array(z)))
    exact = _exact_erf(z)
    nonzero = exact != 0
    rel = np.abs(ours - exact)[nonzero] / np.abs(exact[nonzero])
    assert rel.max() <= ERF_RTOL, (rel.max(), z[nonzero][rel.argmax()])
    assert np.all(ours[~nonzero] == 0)


def test_gelu_matches_float64_gelu():
    x = _grid()
    x = x[np.abs(x) < 1e4]  # x * Phi(x) itself overflows nowhere, but keep the error scale sane
    with mx.stream(mx.cpu):
        ours = np.array(cpu_fast_gelu.gelu_f32(mx.array(x)))
    exact = _exact_gelu(x)
    # |x| * 1e-6 bounds the erf error's effect, plus float32 rounding of the result.
    err = np.abs(ours - exact)
    assert np.all(err <= np.abs(x) * 0.5 * ERF_RTOL + np.abs(exact) * 2.4e-7 + 1e-38), \
        (err.max(), x[err.argmax()])


def test_gelu_uses_fast_path_only_for_float32_on_cpu():
    impls = [i for i in cn.ops.implementations() if i.op == "gelu"]
    assert {i.name for i in impls} == {"gelu", "gelu_poly"}
    x = mx.array(np.linspace(-3, 3, 11, dtype=np.float32))
    with mx.stream(mx.cpu):
        assert all(i.applies(x) for i in impls)
        assert not any(i.applies(x.astype(mx.float16)) for i in impls)


@pytest.mark.parametrize("shape", [(7,), (2, 33, 17, 64), (3, 1, 5)])
def test_gelu_switch_and_plain_op_agree(shape):
    x = mx.array(np.random.default_rng(0).standard_normal(shape, dtype=np.float32) * 3)
    with mx.stream(mx.cpu):
        fast = np.array(cn.gelu(x))
        with cn.ops.disabled("gelu"):
            plain = np.array(cn.gelu(x))
    assert fast.shape == plain.shape == shape
    np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-6)
