"""Gradients where a function has no derivative, taken as PyTorch takes them: max pooling's
tied windows (the whole gradient to the first maximum in row-major order; to the last NaN of a
window holding NaN), and the activations at their kinks. References: PyTorch autograd in float64
on the same float32 values (ties stay ties); every op path (registered implementations on and
off), eagerly and under ``mx.compile``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import candle_nn as cn
import mlx.core as mx
import mlx.nn as mlx_nn
from candle_nn.backends.cuda import kernels as cuda_kernels

RNG = np.random.default_rng(36)


def _torch_pool_grad(x: np.ndarray, dy: np.ndarray, k: int, s: int, p: int) -> np.ndarray:
    tx = torch.tensor(x, dtype=torch.float64).permute(0, 3, 1, 2).requires_grad_()
    ty = torch.nn.functional.max_pool2d(tx, k, s, p)
    (ty * torch.tensor(dy, dtype=torch.float64).permute(0, 3, 1, 2)).sum().backward()
    return tx.grad.permute(0, 2, 3, 1).numpy()


def _tied(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Inputs whose windows hold equal maxima: a constant image (letterbox padding), ReLU'd noise
    rounded to halves (plateaus at 0 and between), a constant band beside noise."""
    band = RNG.standard_normal(shape)
    band[:, :, : shape[2] // 2] = 0.447  # the letterbox grey, 114 / 255
    return {"constant": np.full(shape, 0.447),
            "plateaus": np.round(np.maximum(RNG.standard_normal(shape), 0) * 2) / 2,
            "band": band}


POOLS = [((1, 6, 6, 2), 5, 1, 2), ((2, 9, 8, 3), 3, 2, 1), ((2, 8, 7, 2), 2, 2, 0),
         ((1, 10, 10, 2), 3, 1, 1)]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("case", POOLS, ids=lambda c: "k{1}s{2}p{3}".format(*c))
def test_max_pool_gradient_goes_to_the_first_maximum(case, compiled, device, op_paths) -> None:
    shape, k, s, p = case
    for name, data in _tied(shape).items():
        x = data.astype(np.float32)
        oh, ow = (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1
        dy = RNG.standard_normal((shape[0], oh, ow, shape[3])).astype(np.float32)
        grad = mx.grad(lambda x: (cn.max_pool2d(x, k, s, p) * mx.array(dy)).sum())
        with mx.stream(device.stream):
            got = np.array((mx.compile(grad) if compiled else grad)(mx.array(x)))
        want = _torch_pool_grad(x, dy, k, s, p)
        # each entry is a sum of a few float32 cotangents: exact up to float32 rounding
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_max_pool_gradient_of_non_finite_windows_is_torchs(compiled, device, op_paths) -> None:
    """Two NaNs in one window (the last one takes the gradient), a window of -inf only (its
    first input inside the image takes it), +inf tied with +inf."""
    x = np.round(RNG.standard_normal((2, 7, 6, 3)) * 2) / 2
    x[0, 2, 3, 1] = x[0, 2, 4, 1] = np.nan
    x[1, :4, :4, 2] = -np.inf
    x[1, 5, 1, 0] = x[1, 5, 2, 0] = np.inf
    x = x.astype(np.float32)
    dy = RNG.standard_normal((2, 4, 3, 3)).astype(np.float32)
    grad = mx.grad(lambda x: (cn.max_pool2d(x, 3, 2, 1) * mx.array(dy)).sum())
    with mx.stream(device.stream):
        got = np.array((mx.compile(grad) if compiled else grad)(mx.array(x)))
    want = _torch_pool_grad(x, dy, 3, 2, 1)
    assert not np.isnan(want).any()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_cuda_max_pool_kernel_carries_torchs_gradient(compiled, monkeypatch) -> None:
    """The CUDA kernel's wrapper, its kernel stood in for by MLX's pooling (so this runs on any
    machine; on a CUDA GPU the tests above run the kernel itself): its VJP is the reference's."""
    def stand_in(inputs, template, output_shapes, **_):
        t = dict(template)
        pool = mlx_nn.MaxPool2d((t["KH"], t["KW"]), (t["SH"], t["SW"]), (t["PH"], t["PW"]))
        return [pool(inputs[0])]

    monkeypatch.setattr(cuda_kernels, "_max_pool_kernel", lambda: stand_in)
    shape, k, s, p = POOLS[0]
    x = _tied(shape)["band"].astype(np.float32)
    dy = RNG.standard_normal(shape).astype(np.float32)  # stride 1, "same" padding
    grad = mx.grad(lambda x: (cuda_kernels.max_pool2d(x, (k, k), (s, s), (p, p))
                              * mx.array(dy)).sum())
    got = np.array((mx.compile(grad) if compiled else grad)(mx.array(x)))
    np.testing.assert_allclose(got, _torch_pool_grad(x, dy, k, s, p), rtol=1e-6, atol=1e-6)


KINKS = np.array([0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 1.0, -1.0, 6.0, -6.0, 20.0, -20.0,
                  88.0, -88.0, 1e4, -1e4], np.float32)
TORCH_ACTIVATIONS = {
    "relu": torch.relu, "silu": torch.nn.functional.silu, "sigmoid": torch.sigmoid,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
}


@pytest.mark.parametrize("name", list(TORCH_ACTIVATIONS))
def test_activation_gradients_at_kinks_and_extremes_are_torchs(name, device, op_paths) -> None:
    """Each activation candle_nn exposes, alone, as a layer epilogue (``bias_act``) and fused in
    a conv, at 0 (ReLU's kink: PyTorch's derivative there is 0), signed zeros, tiny and
    saturating values; float64 torch on the same float32 values."""
    x = np.broadcast_to(KINKS[:, None], (16, 8)).reshape(2, 2, 4, 8).copy()  # (N, H, W, C)
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    TORCH_ACTIVATIONS[name](tx).sum().backward()
    want = tx.grad.numpy()
    eye = mx.eye(8)[:, None, None, :]  # a 1x1 identity conv: its output is x exactly
    forms = {"function": lambda a: cn.ACTIVATIONS[name](a),
             "bias_act": lambda a: cn.ops.bias_act(a, mx.zeros(8), name),
             "conv": lambda a: cn.ops.conv2d(a, eye, mx.zeros(8), activation=name)}
    for form, f in forms.items():
        with mx.stream(device.stream):
            got = np.array(mx.grad(lambda a: f(a).sum())(mx.array(x)))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=form)
