"""The CPU training path with a VJP of its own (candle_nn/backends/cpu/conv_grad.py) and
BatchNorm's closed-form VJP (candle_nn/batch_norm.py): gradients against float64 PyTorch
autograd, eagerly and under ``mx.compile``, and non-finite values propagated as MLX's own VJPs
do (max pooling's VJP: tests/candle_nn/test_subgradients.py). Small shapes (CI: 2 cores)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch

import candle_nn as cn
from candle_nn.backends.cpu import conv_grad

RNG = np.random.default_rng(23)
# float32 sums of a few hundred products against float64: max error / max |reference|
TOL = 2e-5


@pytest.fixture(autouse=True)
def _on_the_cpu():
    """These are the CPU's VJPs: run every test on the CPU stream, also where a GPU is the
    default device (there the same calls would take the GPU's paths instead)."""
    with mx.stream(mx.cpu):
        yield


def _rel(got: mx.array, ref: np.ndarray) -> float:
    return float(np.abs(np.array(got, dtype=np.float64) - ref).max() / np.abs(ref).max())


def _nhwc(t: torch.Tensor) -> np.ndarray:
    return t.permute(0, 2, 3, 1).numpy()


CONVS = [  # (N, H, W, C, O, k, stride, padding)
    (2, 9, 9, 3, 5, 3, 1, 1), (2, 9, 8, 4, 6, 3, 2, 1), (1, 11, 10, 3, 4, 7, 2, 3),
    (2, 6, 5, 4, 6, 1, 1, 0), (2, 8, 7, 4, 6, 1, 2, 0), (1, 7, 7, 3, 2, 2, 2, 0),
    (1, 6, 6, 2, 3, 3, 3, 0),
]


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("shape", CONVS, ids=lambda s: "x".join(map(str, s)))
def test_conv2d_gradients_match_float64_torch(shape, compiled) -> None:
    n, h, w, c, o, k, s, p = shape
    x = RNG.standard_normal((n, h, w, c)).astype(np.float32)
    wt = RNG.standard_normal((o, k, k, c)).astype(np.float32)
    bias = RNG.standard_normal(o).astype(np.float32)
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    dy = RNG.standard_normal((n, oh, ow, o)).astype(np.float32)

    def loss(x, w, b):
        return (cn.ops.conv2d(x, w, b, (s, s), (p, p), activation="relu") * mx.array(dy)).sum()

    grad = mx.grad(loss, argnums=(0, 1, 2))
    conv_grad._CONVS.clear()
    gx, gw, gb = (mx.compile(grad) if compiled else grad)(mx.array(x), mx.array(wt),
                                                          mx.array(bias))
    assert ((s, s), (p, p)) in conv_grad._CONVS  # this path ran, not MLX's conv VJP
    tx = torch.tensor(x, dtype=torch.float64).permute(0, 3, 1, 2).requires_grad_()
    tw = torch.tensor(wt, dtype=torch.float64).permute(0, 3, 1, 2).requires_grad_()
    tb = torch.tensor(bias, dtype=torch.float64).requires_grad_()
    y = torch.relu(torch.nn.functional.conv2d(tx, tw, tb, stride=s, padding=p))
    (y * torch.tensor(dy, dtype=torch.float64).permute(0, 3, 1, 2)).sum().backward()
    assert _rel(gx, _nhwc(tx.grad)) < TOL
    assert _rel(gw, _nhwc(tw.grad)) < TOL
    assert _rel(gb, tb.grad.numpy()) < TOL


@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_gradient_propagates_nan_as_mlx_does(stride) -> None:
    """A NaN in ``x`` and one in the cotangent reach the same gradient entries as through MLX's
    conv VJP (a non-finite weight: conv_grad.py's docstring)."""
    x = RNG.standard_normal((1, 8, 8, 3)).astype(np.float32)
    x[0, 3, 4, 1] = np.nan
    wt = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    o = (8 + 2 - 3) // stride + 1
    dy = RNG.standard_normal((1, o, o, 4)).astype(np.float32)
    dy[0, 1, 2, 3] = np.nan

    def grads():
        return mx.grad(lambda x, w: (cn.ops.conv2d(x, w, None, (stride, stride), (1, 1))
                                     * mx.array(dy)).sum(), argnums=(0, 1))(mx.array(x),
                                                                             mx.array(wt))

    ours = grads()
    with cn.ops.disabled("conv_grad"):
        reference = grads()
    for a, b in zip(ours, reference):
        a, b = np.array(a), np.array(b)
        assert np.isnan(a).any() and not np.isnan(a).all()
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
        finite = ~np.isnan(a)
        np.testing.assert_allclose(a[finite], b[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("compiled", [False, True])
def test_batch_norm_train_gradient_matches_float64_torch(compiled) -> None:
    c = 5
    x = (RNG.standard_normal((3, 6, 7, c)) * 3 + 1).astype(np.float32)
    weight = RNG.standard_normal(c).astype(np.float32)
    bias = RNG.standard_normal(c).astype(np.float32)
    dy = RNG.standard_normal(x.shape).astype(np.float32)
    bn = cn.BatchNorm2d(mx.zeros(c), mx.ones(c), mx.array(weight), mx.array(bias),
                        device=cn.Device.cpu()).train()

    def loss(x, w, b):
        bn.weight, bn.bias = w, b
        return (bn(x) * mx.array(dy)).sum()

    grad = mx.grad(loss, argnums=(0, 1, 2))
    gx, gw, gb = (mx.compile(grad) if compiled else grad)(mx.array(x), mx.array(weight),
                                                          mx.array(bias))
    ref = torch.nn.BatchNorm2d(c, dtype=torch.float64).train()
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(weight)), ref.bias.copy_(torch.tensor(bias))
    tx = torch.tensor(x, dtype=torch.float64).permute(0, 3, 1, 2).requires_grad_()
    (ref(tx) * torch.tensor(dy, dtype=torch.float64).permute(0, 3, 1, 2)).sum().backward()
    assert _rel(gx, _nhwc(tx.grad)) < TOL
    assert _rel(gw, ref.weight.grad.numpy()) < TOL
    assert _rel(gb, ref.bias.grad.numpy()) < TOL


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_batch_norm_train_gradient_propagates_non_finite_as_mlx_does(bad) -> None:
    """A NaN or Inf input poisons its channel's statistics: every gradient of that channel is
    NaN in MLX's own VJP of the reference expression, and in the closed form."""
    c = 4
    x = RNG.standard_normal((2, 5, 5, c)).astype(np.float32)
    x[0, 1, 1, 2] = bad
    dy = mx.array(RNG.standard_normal(x.shape).astype(np.float32))
    bn = cn.BatchNorm2d(mx.zeros(c), mx.ones(c), mx.ones(c), mx.zeros(c),
                        device=cn.Device.cpu()).train()
    grad = mx.grad(lambda x: (bn(x) * dy).sum())
    ours = np.array(grad(mx.array(x)))
    with cn.ops.disabled("batch_norm_vjp"):
        reference = np.array(grad(mx.array(x)))
    assert np.isnan(reference[..., 2]).all() and not np.isnan(np.delete(reference, 2, -1)).any()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(reference))
    finite = ~np.isnan(reference)
    np.testing.assert_allclose(ours[finite], reference[finite], rtol=1e-4, atol=1e-5)
