"""The compiled CPU kernels (candle_nn._cpu_kernels, backends/cpu/) AND the pure-MLX paths that
stand in for them, each against float64 references; the layers' fused epilogue against the plain
ops on every device; and whether the kernels are loaded where they must be.

Loaded or not: a ``pip install`` of this checkout (the README's set-up, CI) builds the kernels,
so there they MUST be loaded (a broken build fails :func:`test_kernels_are_loaded_when_installed`).
A source checkout used through ``PYTHONPATH`` (the GPU machine's runs) has none; then the kernel
tests below check that status says so and run every parity check on the fallback paths only
(``CANDLE_NN_REQUIRE_NATIVE=1`` makes the kernels required anyway, ``=0`` never). Kernels built
against another libmlx than the one in use (mlx-cpu, then MLX's CUDA build installed over it)
are refused at load and not required.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import math
import os
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from conftest import ROOT
from helpers.activation_reference import activation64
from helpers.thread_bits import assert_same_bits_on_1_2_3_threads

import candle_nn as cn
from candle_nn.backends.cpu import kernels as cpu_native

NATIVE = cpu_native.module() is not None
ACTS = ["identity", "relu", "silu", "gelu", "sigmoid"]


def _installed_from_this_checkout() -> bool:
    """True when pip installed candle_nn from this checkout (editable or not), so its build ran."""
    try:
        dist = importlib.metadata.distribution("candle-nn-mlx")
    except importlib.metadata.PackageNotFoundError:
        return False
    package = Path(cn.__file__).resolve().parent
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct.get("dir_info", {}).get("editable"):
        return direct.get("url", "").rstrip("/") == ROOT.as_uri() and package == ROOT / "candle_nn"
    return any(Path(dist.locate_file(f)).resolve() == package / "__init__.py"
               for f in dist.files or ())


def test_kernels_are_loaded_when_installed() -> None:
    required = cn.config.get("CANDLE_NN_REQUIRE_NATIVE") or None
    status = cpu_native.status()
    # Installed, the build ran, so the kernels must load - unless MLX was swapped for another
    # build after it (the README's CUDA set-up): then they are refused, and status says so.
    swapped = "another libmlx" in status.detail
    must = (_installed_from_this_checkout() and not swapped) if required is None \
        else required == "1"
    assert status.loaded is NATIVE
    if must:
        assert status.loaded, f"installed by pip, yet the C++ kernels are not loaded: {status}"
        assert status.threads and status.threads >= 1
        assert "CPU kernels (C++): loaded" in str(cn.info())
    else:
        # a source checkout: status must say why, and info() must show it
        assert status.loaded or "not built" in status.detail or "build failed" in status.detail \
            or "MLX" in status.detail or swapped, status
        assert "CPU kernels (C++)" in str(cn.info())


def _bound(act: str, ref: np.ndarray, v: np.ndarray, summands: np.ndarray) -> np.ndarray:
    """Allowed |error| vs float64: float32 rounding of the sums (``summands``: the sum of their
    magnitudes; activations' slopes are <= 1.13), the 2.2-ulp exp (SiLU), erf within 1e-6
    relative (GELU: 0.5e-6 |v|, as tests/candle_nn/backends/test_cpu_fast_gelu.py); sigmoid's
    slope is <= 1/4 and it is 0 below -88 (where it is below 1e-38)."""
    bound = 1.5 * 1.2e-7 * summands + 1e-30
    if act == "sigmoid":
        bound = 0.25 * 1.5 * 1.2e-7 * summands + 6e-7 * np.abs(ref) + 1e-38
    if act == "silu":
        bound = bound + 6e-7 * np.abs(ref)
    if act == "gelu":
        bound = bound + 0.5e-6 * np.abs(v) + 2.4e-7 * np.abs(ref)
    return bound


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("mode", ["none", "before", "after"])
@pytest.mark.parametrize("shape", [(2, 9, 7, 24), (1, 3), (70001,)])
def test_bias_act_against_float64(path, act, mode, shape) -> None:
    rng = np.random.default_rng(len(shape) * 7 + len(act))
    x = (rng.standard_normal(shape) * 6).astype(np.float32)
    x.flat[:4] = [-100.0, 100.0, 0.0, -5.5]  # tails: exp/erf clamped, exact zero
    b = (rng.standard_normal(shape[-1]) * 2).astype(np.float32)
    r = (rng.standard_normal(shape) * 2).astype(np.float32)
    residual = None if mode == "none" else mx.array(r)
    with mx.stream(mx.cpu):
        ours = np.array(cn.activation.bias_act(
            mx.array(x), mx.array(b), None if act == "identity" else act, residual,
            residual_after_activation=mode == "after"))
    v = x.astype(np.float64) + b
    if mode == "before":
        v = v + r
    ref = activation64(v, act) + (r if mode == "after" else 0)
    err = np.abs(ours - ref)
    assert ours.shape == shape and ours.dtype == np.float32
    summands = np.abs(x) + np.abs(b) + (np.abs(r) if mode == "before" else 0)
    bound = _bound(act, ref, v, summands) + (
        1.2e-7 * (np.abs(ref) + np.abs(r)) if mode == "after" else 0)
    assert np.all(err <= bound), (path, float((err / bound).max()), x.flat[(err / bound).argmax()])


@pytest.mark.parametrize("act", ["silu", "gelu", "sigmoid"])
def test_activations_against_float64(path, act) -> None:
    """``cn.silu`` / ``cn.gelu`` / ``cn.sigmoid`` (no bias), on a non-contiguous (transposed)
    input too."""
    x = np.linspace(-30, 30, 200_003, dtype=np.float32)
    with mx.stream(mx.cpu):
        fn = {"silu": cn.silu, "gelu": cn.gelu, "sigmoid": cn.sigmoid}[act]
        ours = np.array(fn(mx.array(x)))
        grid = mx.array(x[:200_000].reshape(400, 500))
        transposed = np.array(fn(grid.T))
    ref = activation64(x, act)
    assert np.all(np.abs(ours - ref) <= _bound(act, ref, x, np.abs(x))), path
    np.testing.assert_array_equal(transposed, ours[:200_000].reshape(400, 500).T)


@pytest.mark.parametrize("shape", [(3, 5, 49, 49), (2, 1, 4096), (7, 1), (4, 8, 13)])
def test_softmax_against_float64(path, shape) -> None:
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 8).astype(np.float32)
    x[..., 0] = -np.inf  # a masked entry (a whole row when shape[-1] == 1: NaN, as MLX's)
    with mx.stream(mx.cpu):
        ours = np.array(cn.softmax(mx.array(x), axis=-1))
        if shape[-1] == 1:
            plain = np.array(mx.softmax(mx.array(x), axis=-1, precise=True))
            assert np.isnan(ours).all() and np.isnan(plain).all(), path
            return
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    ref = e / e.sum(axis=-1, keepdims=True)
    # float32 rounding of x - max, amplified by exp, plus the sum's rounding over a row
    shift = np.where(np.isinf(x64), 0, np.abs(x64 - x64.max(axis=-1, keepdims=True)))
    bound = ref * (1.2e-7 * shift + 5e-6) + 1e-9
    assert np.all(np.abs(ours - ref) <= bound), (path, (np.abs(ours - ref) / bound).max())


def test_attention_matches_mlx_fast_attention(path) -> None:
    """CPU attention (matmul + our softmax + matmul) vs MLX's fused op, additive and bool masks."""
    rng = np.random.default_rng(3)
    q, k, v = (mx.array(rng.standard_normal((2, 4, 49, 32), dtype=np.float32)) for _ in range(3))
    bias = mx.array(rng.standard_normal((4, 49, 49), dtype=np.float32))
    keep = mx.array(rng.random((49, 49)) > 0.2)
    with mx.stream(mx.cpu):
        for mask in (None, bias, keep):
            ours = np.array(cn.scaled_dot_product_attention(q, k, v, mask=mask))
            ref = np.array(mx.fast.scaled_dot_product_attention(q, k, v, scale=32 ** -0.5,
                                                                 mask=mask))
            assert np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max(), path


@pytest.mark.parametrize("shape", [(2, 9, 7, 128), (4096, 256), (3, 5, 37), (1, 3)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_against_float64(path, shape, affine) -> None:
    """``LayerNorm`` (the compiled kernel, or ``mx.fast.layer_norm``) vs float64, rows with a
    large mean too: within 1e-5 of the output's max."""
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 3 + rng.standard_normal(shape[:-1] + (1,)) * 20)
    x = x.astype(np.float32)
    tensors = {"weight": rng.standard_normal(shape[-1], dtype=np.float32),
               "bias": rng.standard_normal(shape[-1], dtype=np.float32)}
    config = cn.LayerNormConfig(eps=1e-5, affine=affine)
    norm = cn.LayerNorm.load(cn.VarBuilder.from_tensors(tensors, device=cn.Device.cpu()),
                             shape[-1], config)
    ours = np.array(norm(mx.array(x)))
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    if affine:
        ref = ref * tensors["weight"] + tensors["bias"]
    assert np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max(), path


def _packed_attention64(qkv: np.ndarray, heads: int, scale: float,
                        bias: np.ndarray | None) -> np.ndarray:
    b, n, width = qkv.shape
    d = width // (3 * heads)
    q, k, v = qkv.astype(np.float64).reshape(b, n, heads, 3, d).transpose(3, 0, 2, 1, 4)
    s = q @ k.swapaxes(-1, -2) * scale + (0 if bias is None else bias)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(b, n, heads * d)


@pytest.mark.parametrize("b,n,heads,d", [(5, 49, 4, 32), (2, 196, 5, 32), (3, 7, 3, 5),
                                         (1, 50, 2, 20)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_packed_qkv_attention_against_float64(path, b, n, heads, d, with_bias) -> None:
    """``cn.packed_qkv_attention`` (the compiled kernel, or the reshapes + MLX attention) vs
    float64: within 1e-5 of the output's max (TinyViT's windows 7x7 and 14x14, odd sizes)."""
    rng = np.random.default_rng(n * heads + d)
    qkv = (rng.standard_normal((b, n, heads * 3 * d)) * 2).astype(np.float32)
    bias = rng.standard_normal((heads, n, n)).astype(np.float32) if with_bias else None
    with mx.stream(mx.cpu):
        ours = np.array(cn.packed_qkv_attention(
            mx.array(qkv), heads, scale=d ** -0.5, bias=None if bias is None else mx.array(bias)))
    ref = _packed_attention64(qkv, heads, d ** -0.5, bias)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max(), path


def _window_attention64(qkv: np.ndarray, heads: int, window: int, scale: float,
                        bias: np.ndarray | None, pad: np.ndarray | None) -> np.ndarray:
    """The image padded with ``pad`` (zeros) to whole windows, cut into windows, attention per
    window and head in float64, put back and cropped."""
    b, h, w, width = qkv.shape
    hp, wp = -(-h // window) * window, -(-w // window) * window
    full = np.empty((b, hp, wp, width))
    full[...] = 0.0 if pad is None else pad.astype(np.float64)
    full[:, :h, :w] = qkv
    nh, nw = hp // window, wp // window
    win = full.reshape(b, nh, window, nw, window, width).transpose(0, 1, 3, 2, 4, 5)
    out = _packed_attention64(win.reshape(-1, window * window, width), heads, scale, bias)
    out = out.reshape(b, nh, nw, window, window, -1).transpose(0, 1, 3, 2, 4, 5)
    return out.reshape(b, hp, wp, -1)[:, :h, :w]


@pytest.mark.parametrize("b,h,w,heads,d,window,with_pad", [
    (1, 16, 16, 4, 32, 7, True),     # TinyViT's stages: padded to whole 7x7 windows
    (2, 14, 28, 5, 32, 14, True),    # no padding needed (the pad row unused)
    (1, 9, 11, 2, 5, 4, True),       # odd widths, padding right and bottom
    (2, 5, 3, 3, 8, 7, False),       # the image smaller than one window, zero padding
    (1, 3, 4, 2, 8, 1, False),       # 1x1 windows
])
@pytest.mark.parametrize("with_bias", [True, False])
def test_window_attention_against_float64(path, b, h, w, heads, d, window, with_pad,
                                          with_bias) -> None:
    """``cn.window_attention`` (the compiled kernel reading the image in place, or the
    partition + ``packed_qkv_attention`` + merge reference) vs float64: within 1e-5 of the
    output's max."""
    rng = np.random.default_rng(h * w + heads * d + window)
    n = window * window
    qkv = (rng.standard_normal((b, h, w, heads * 3 * d)) * 2).astype(np.float32)
    bias = rng.standard_normal((heads, n, n)).astype(np.float32) if with_bias else None
    pad = rng.standard_normal(heads * 3 * d).astype(np.float32) * 2 if with_pad else None
    with mx.stream(mx.cpu):
        ours = np.array(cn.window_attention(
            mx.array(qkv), heads, window, scale=d ** -0.5,
            bias=None if bias is None else mx.array(bias),
            pad=None if pad is None else mx.array(pad)))
    ref = _window_attention64(qkv, heads, window, d ** -0.5, bias, pad)
    assert ours.shape == ref.shape == (b, h, w, heads * d)
    assert np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max(), path


@pytest.mark.parametrize("b,lq,lk,heads,d,dv", [(2, 7, 4096, 8, 16, 16), (1, 4096, 7, 8, 16, 16),
                                              (3, 5, 9, 2, 12, 20), (1, 1, 1, 1, 3, 3)])
def test_multi_head_attention_against_float64(path, b, lq, lk, heads, d, dv) -> None:
    """``cn.multi_head_attention`` (the compiled kernel, or transposes + MLX attention) vs
    float64: SAM decoder's token <-> image shapes, odd widths, one key."""
    rng = np.random.default_rng(lq + lk + d)
    q, k = (rng.standard_normal((b, n, heads * d)).astype(np.float32) * 2 for n in (lq, lk))
    v = rng.standard_normal((b, lk, heads * dv)).astype(np.float32)
    with mx.stream(mx.cpu):
        ours = np.array(cn.multi_head_attention(mx.array(q), mx.array(k), mx.array(v), heads))
    q64, k64, v64 = (x.astype(np.float64).reshape(b, x.shape[1], heads, -1).transpose(0, 2, 1, 3)
                     for x in (q, k, v))
    s = q64 @ k64.swapaxes(-1, -2) / math.sqrt(d)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    ref = ((p / p.sum(axis=-1, keepdims=True)) @ v64).transpose(0, 2, 1, 3).reshape(b, lq, -1)
    assert ours.shape == ref.shape
    # the fallback is MLX's own attention: 1.05e-5 of max |ref| over 4096 keys on the H100
    # machine's Xeon (16 BLAS threads); the compiled kernel stays within 1e-5
    tol = 1e-5 if path == "native" else 2e-5
    assert np.abs(ours - ref).max() <= tol * np.abs(ref).max(), path


def _assert_grad_matches_the_plain_ops(loss, arg: mx.array, path: str) -> None:
    """``mx.grad(loss)(arg)`` on the CPU with the fast paths (``path``) against the plain MLX ops
    (``cn.ops.disabled("cpu")``): within 1e-4 of the largest element."""
    with mx.stream(mx.cpu):
        ours = np.array(mx.grad(loss)(arg))
        with cn.ops.disabled("cpu"):
            plain = np.array(mx.grad(loss)(arg))
    assert np.abs(ours - plain).max() <= 1e-4 * np.abs(plain).max(), path


def test_multi_head_attention_gradients_match_the_plain_ops(path) -> None:
    rng = np.random.default_rng(24)
    q = mx.array(rng.standard_normal((2, 5, 16), dtype=np.float32))
    kv = mx.array(rng.standard_normal((2, 11, 16), dtype=np.float32))

    def loss(x: mx.array) -> mx.array:
        return (cn.multi_head_attention(x, kv, kv * 2, 4) ** 2).sum()

    _assert_grad_matches_the_plain_ops(loss, q, path)


def test_packed_qkv_attention_gradients_match_the_plain_ops(path) -> None:
    """Under mx.grad the kernel builds MLX's ops (reshape, split, matmul, softmax)."""
    rng = np.random.default_rng(23)
    qkv = mx.array(rng.standard_normal((3, 49, 2 * 3 * 8), dtype=np.float32))
    bias = mx.array(rng.standard_normal((2, 49, 49), dtype=np.float32))

    def loss(x: mx.array) -> mx.array:
        return (cn.packed_qkv_attention(x, 2, bias=bias) ** 2).sum()

    _assert_grad_matches_the_plain_ops(loss, qkv, path)


def test_window_attention_gradients_match_the_plain_ops(path) -> None:
    """Under mx.grad the dispatcher runs the reference (pad, partition, attention, merge)."""
    rng = np.random.default_rng(25)
    qkv = mx.array(rng.standard_normal((2, 9, 10, 2 * 3 * 8), dtype=np.float32))
    bias = mx.array(rng.standard_normal((2, 16, 16), dtype=np.float32))
    pad = mx.array(rng.standard_normal((2 * 3 * 8,), dtype=np.float32))

    def loss(x: mx.array) -> mx.array:
        return (cn.window_attention(x, 2, 4, bias=bias, pad=pad) ** 2).sum()

    _assert_grad_matches_the_plain_ops(loss, qkv, path)


def test_kernels_give_the_same_bits_on_one_and_two_threads() -> None:
    """Each element is computed alone, so the thread split cannot change a result."""
    if not NATIVE:
        assert not any(r["available"] for r in cn.ops.status() if r["name"] == "softmax")
        return
    kernels = cpu_native.module()
    rng = np.random.default_rng(5)
    x = mx.array(rng.standard_normal((3, 97, 61, 40), dtype=np.float32))
    b = mx.array(rng.standard_normal((40,), dtype=np.float32))
    assert_same_bits_on_1_2_3_threads(lambda: [
        kernels.bias_act(x, b, x, kernels.Act.silu, kernels.Residual.before_act),
        kernels.softmax_last(x),
        kernels.attention_packed(x[:, :49, 0, :36], None, 2, 0.3)])


def test_kernels_refuse_what_they_do_not_support() -> None:
    if not NATIVE:
        assert cpu_native.status().loaded is False
        return
    kernels = cpu_native.module()
    with mx.stream(mx.cpu):
        with pytest.raises(ValueError, match="float32 only"):
            kernels.bias_act(mx.zeros((2, 3), dtype=mx.float16))
        with pytest.raises(ValueError, match="bias must be"):
            kernels.bias_act(mx.zeros((2, 3)), mx.zeros((4,)))
        with pytest.raises(ValueError, match="residual must"):
            kernels.bias_act(mx.zeros((2, 3)), None, mx.zeros((3,)), 0, 1)
        empty = kernels.bias_act(mx.zeros((0, 3)), mx.zeros((3,)), None, 2)
        assert empty.shape == (0, 3)
        mx.eval(empty)


@pytest.mark.parametrize("act", ["relu", "silu", "gelu", "sigmoid", None])
@pytest.mark.parametrize("after", [False, True])
def test_conv_epilogue_equals_the_plain_ops(device, act, after) -> None:
    """``Conv2d(x, activation=, residual=)`` vs ``conv(x)`` then the ops one by one: bit for bit
    off the CPU (the GPU path is unchanged), within the fast paths' tolerance on it."""
    rng = np.random.default_rng(11)
    tensors = {"weight": rng.standard_normal((16, 8, 3, 3), dtype=np.float32) * 0.3,
               "bias": rng.standard_normal(16, dtype=np.float32)}
    vb = cn.VarBuilder.from_tensors(tensors, device=device)
    conv = cn.Conv2d.load(vb, 8, 16, 3, cn.Conv2dConfig(padding=1))
    x = mx.array(rng.standard_normal((2, 9, 9, 8), dtype=np.float32))
    residual = mx.array(rng.standard_normal((2, 9, 9, 16), dtype=np.float32))
    fused = conv(x, activation=act, residual=residual, residual_after_activation=after)
    with conv.on_device():
        y = conv(x)
        y = y if after else y + residual
        y = cn.ACTIVATIONS[act](y) if act else y
        plain = y + residual if after else y
    fused, plain = np.array(fused), np.array(plain)
    if device.kind == "cpu":
        assert np.abs(fused - plain).max() <= 2e-6 * np.abs(plain).max()
    else:
        np.testing.assert_array_equal(fused, plain)


@pytest.mark.parametrize("act", ["gelu", None])
def test_conv_transpose_epilogue_equals_the_plain_ops(device, act) -> None:
    """``ConvTranspose2d(x, activation=)`` vs the conv then the ops one by one (bit for bit off
    the CPU)."""
    rng = np.random.default_rng(13)
    tensors = {"weight": rng.standard_normal((8, 6, 2, 2), dtype=np.float32),
               "bias": rng.standard_normal(6, dtype=np.float32)}
    conv = cn.ConvTranspose2d.load(cn.VarBuilder.from_tensors(tensors, device=device), 8, 6, 2,
                                   cn.ConvTranspose2dConfig(stride=2))
    x = mx.array(rng.standard_normal((2, 5, 7, 8), dtype=np.float32))
    fused = np.array(conv(x, activation=act))
    with conv.on_device(), cn.ops.disabled("conv_transpose2d_blocks"):
        y = cn.ops.blocks_to_image(cn.ops.conv_transpose2d_blocks(x, conv.weight), (2, 2))
        y = y + conv.bias
        plain = np.array(cn.gelu(y) if act else y)
    if device.kind == "cpu":
        assert np.abs(fused - plain).max() <= 2e-6 * np.abs(plain).max()
    else:
        np.testing.assert_array_equal(fused, plain)


def test_linear_epilogue_equals_the_plain_ops(device) -> None:
    rng = np.random.default_rng(12)
    tensors = {"weight": rng.standard_normal((24, 16), dtype=np.float32),
               "bias": rng.standard_normal(24, dtype=np.float32)}
    lin = cn.Linear.load(cn.VarBuilder.from_tensors(tensors, device=device), 16, 24)
    x = mx.array(rng.standard_normal((3, 5, 16), dtype=np.float32))
    fused = np.array(lin(x, activation="gelu"))
    with lin.on_device():
        plain = np.array(cn.gelu(mx.addmm(lin.bias, x, lin.weight.T)))
    if device.kind == "cpu":
        assert np.abs(fused - plain).max() <= 2e-6 * np.abs(plain).max()
    else:
        np.testing.assert_array_equal(fused, plain)


@pytest.mark.parametrize("rows,k,n", [(7, 2048, 256), (7, 256, 2048), (1, 37, 9), (8, 5, 3)])
def test_linear_few_rows_against_float64(path, rows, k, n) -> None:
    """``Linear`` on a few rows (the compiled dot-product kernel, or MLX's addmm) vs float64:
    within 1e-6 of the output's max (SAM's decoder token shapes, odd K and N)."""
    rng = np.random.default_rng(rows * k + n)
    tensors = {"weight": rng.standard_normal((n, k), dtype=np.float32),
               "bias": rng.standard_normal(n, dtype=np.float32)}
    lin = cn.Linear.load(cn.VarBuilder.from_tensors(tensors, device=cn.Device.cpu()), k, n)
    x = rng.standard_normal((1, rows, k), dtype=np.float32)
    ours = np.array(lin(mx.array(x)))
    ref = x.astype(np.float64) @ tensors["weight"].T.astype(np.float64) + tensors["bias"]
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-6 * np.abs(ref).max(), path


@pytest.mark.parametrize("act", ["gelu", None])
def test_linear_residual_equals_the_plain_ops(device, act) -> None:
    """``Linear(x, activation=, residual=)`` == ``act(x @ W.T + b) + residual``: bit for bit off
    the CPU, within float32 rounding on it (the fused pass may contract GELU's last multiply with
    the residual add into one FMA)."""
    rng = np.random.default_rng(14)
    tensors = {"weight": rng.standard_normal((24, 16), dtype=np.float32),
               "bias": rng.standard_normal(24, dtype=np.float32)}
    lin = cn.Linear.load(cn.VarBuilder.from_tensors(tensors, device=device), 16, 24)
    x = mx.array(rng.standard_normal((3, 5, 16), dtype=np.float32))
    r = mx.array(rng.standard_normal((3, 5, 24), dtype=np.float32))
    fused = np.array(lin(x, activation=act, residual=r))
    plain = np.array(lin(x, activation=act) + r)
    if device.kind == "cpu":
        assert np.abs(fused - plain).max() <= 2e-6 * np.abs(plain).max()
    else:
        np.testing.assert_array_equal(fused, plain)


def test_switch_off_takes_no_kernel() -> None:
    """``CANDLE_NN_CPU_FAST=0`` (``cn.ops.disable("cpu")``) turns the compiled kernels off too:
    every CPU implementation reports off, and the results are the references' bits."""
    x = mx.array(np.linspace(-4, 4, 64, dtype=np.float32).reshape(8, 8))
    ops = cn.ops.ops()
    with cn.ops.disabled("cpu"), mx.stream(mx.cpu):
        assert not any(r["enabled"] for r in cn.ops.status() if r["backend"] == "cpu")
        for ours, ref in ((cn.gelu(x), ops["gelu"].reference(x)),
                          (cn.silu(x), ops["silu"].reference(x)),
                          (cn.softmax(x), ops["softmax"].reference(x)),
                          (cn.ops.bias_act(x, x[0], "relu"),
                           ops["bias_act"].reference(x, x[0], "relu"))):
            assert mx.array_equal(ours, ref).item()
    with mx.stream(mx.cpu):
        mx.eval(cn.gelu(x), cn.softmax(x))


def test_depthwise_kernel_gives_the_same_bits_on_one_and_two_threads() -> None:
    """Each output pixel is computed by one thread in a fixed order: no split changes a bit."""
    if not NATIVE:
        assert not any(r["available"] for r in cn.ops.status()
                       if r["name"] == "depthwise" and r["backend"] == "cpu")
        return
    kernels = cpu_native.module()
    rng = np.random.default_rng(6)
    x = mx.array(rng.standard_normal((2, 33, 29, 48), dtype=np.float32))
    w = mx.array(rng.standard_normal((48, 3, 3, 1), dtype=np.float32))
    b = mx.array(rng.standard_normal((48,), dtype=np.float32))
    assert_same_bits_on_1_2_3_threads(lambda: [kernels.depthwise_conv2d(
        x, w, b, None, (1, 1), (1, 1), (1, 1), kernels.Act.gelu, kernels.Residual.none)])


def _depthwise64(x: np.ndarray, w: np.ndarray, padding: tuple[int, int]) -> np.ndarray:
    """Stride-1 depthwise conv in float64: x (N, H, W, C), w (C, kH, kW, 1)."""
    (ph, pw), (_, kh, kw, _) = padding, w.shape
    xp = np.pad(x.astype(np.float64), [(0, 0), (ph, ph), (pw, pw), (0, 0)])
    oh, ow = xp.shape[1] - kh + 1, xp.shape[2] - kw + 1
    out = np.zeros((x.shape[0], oh, ow, x.shape[3]))
    for i in range(kh):
        for j in range(kw):
            out += xp[:, i:i + oh, j:j + ow, :] * w[:, i, j, 0].astype(np.float64)
    return out


@pytest.mark.parametrize("shape,kernel,padding", [
    ((2, 5, 40, 256), (3, 3), (1, 1)),  # rows of 40 pixels across epilogue chunks of 16
    ((1, 7, 23, 40), (3, 3), (1, 1)), ((1, 4, 9, 24), (5, 3), (2, 0)),
    ((1, 3, 3, 8), (3, 3), (2, 2)), ((1, 6, 1, 16), (3, 3), (1, 1)),
    ((1, 5, 11, 12), (3, 3), (1, 1)),  # 12 channels: a vector of 8 and 4 single ones
])
@pytest.mark.parametrize("act,mode", [("gelu", "before"), (None, "none"), ("silu", "after")])
def test_depthwise_stride1_against_float64(path, shape, kernel, padding, act, mode) -> None:
    """Every pixel of a stride-1 depthwise conv with its fused epilogue (activation, residual
    before or after it) vs float64: within 1e-5 of the output's max."""
    rng = np.random.default_rng(shape[2] + kernel[0])
    c = shape[3]
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal((c, *kernel, 1), dtype=np.float32)
    b = rng.standard_normal(c, dtype=np.float32)
    v = _depthwise64(x, w, padding) + b
    r = rng.standard_normal(v.shape, dtype=np.float32)
    residual = None if mode == "none" else mx.array(r)
    with mx.stream(mx.cpu):
        ours = np.array(cn.ops.depthwise_conv2d(
            mx.array(x), mx.array(w), mx.array(b), (1, 1), padding, activation=act,
            residual=residual, residual_after_activation=mode == "after"))
    ref = activation64(v + (r if mode == "before" else 0), act or "identity")
    ref = ref + (r if mode == "after" else 0)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max(), path


def test_depthwise_gradients_match_the_plain_ops(path) -> None:
    """Under mx.grad the depthwise kernel builds MLX's grouped conv: the plain ops' gradients."""
    rng = np.random.default_rng(22)
    tensors = {"weight": rng.standard_normal((16, 1, 3, 3), dtype=np.float32),
               "bias": rng.standard_normal(16, dtype=np.float32)}
    conv = cn.Conv2d.load(cn.VarBuilder.from_tensors(tensors, device=cn.Device.cpu()), 16, 16, 3,
                          cn.Conv2dConfig(padding=1, stride=2, groups=16))
    x = mx.array(rng.standard_normal((2, 9, 9, 16), dtype=np.float32))

    def loss(weight: mx.array) -> mx.array:
        conv.weight = weight
        return (conv(x, activation="gelu") ** 2).sum()

    _assert_grad_matches_the_plain_ops(loss, conv.weight, path)


def test_convs_stay_on_mlx_without_an_optimized_sgemm() -> None:
    """No optimized BLAS (blas.py found none) and no packed GEMM (off, or a CPU without
    AVX-512F): the compiled im2col conv has no sgemm and is not used. (A 3x3 stride-1 conv
    takes Winograd, which has its own GEMM: a stride-2 conv here.)"""
    if not NATIVE:
        assert not cpu_native.has_sgemm()
        return
    kernels = cpu_native.module()
    assert cpu_native.has_sgemm() is cn.blas.status().optimized
    x = mx.zeros((1, 5, 5, 3))
    w = mx.ones((4, 3, 3, 3))

    def available() -> dict[str, bool]:
        return {r["name"]: r["available"] for r in cn.ops.status() if r["op"] == "conv2d"}

    try:
        kernels.set_sgemm(0)
        cn.ops.refresh()
        assert available()["im2col"] is False
        assert available()["winograd"] is True  # Winograd has its own GEMM
        with mx.stream(mx.cpu), pytest.raises(RuntimeError, match="no sgemm"):
            kernels.conv2d_fused(x, w, None, None, (1, 1), (1, 1))
    finally:
        kernels.set_sgemm(cpu_native.sgemm_address())
        cn.ops.refresh()
    assert available()["im2col"] is (cn.blas.status().optimized and sys.platform == "linux")


def test_the_conv_sgemm_is_the_optimized_blas() -> None:
    """The address handed to the kernels lies in the optimized library blas.py bound to MLX (for
    OpenBLAS: a library with ``openblas_get_config``), not in MLX's bundled reference BLAS."""
    address = cpu_native.sgemm_address()
    status = cn.blas.status()
    if not status.optimized or sys.platform != "linux":
        assert address == 0
        return

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    info = DlInfo()
    assert address and ctypes.CDLL(None).dladdr(ctypes.c_void_p(address), ctypes.byref(info))
    assert info.dli_sname == b"cblas_sgemm"
    library = ctypes.CDLL(os.fsdecode(info.dli_fname), mode=os.RTLD_NOLOAD)
    if status.name.startswith("OpenBLAS"):
        assert hasattr(library, "openblas_get_config"), info.dli_fname
    assert not hasattr(library, "xerbla_array_") or hasattr(library, "openblas_get_config")


def test_gradients_flow_through_the_fused_layers(path) -> None:
    """Under mx.grad the kernels build MLX's own ops (the primitives have no vjp): training
    through ``activation=``/``residual=``, GELU and softmax gives the plain ops' gradients."""
    rng = np.random.default_rng(21)
    tensors = {"weight": rng.standard_normal((6, 4, 3, 3), dtype=np.float32) * 0.3,
               "bias": rng.standard_normal(6, dtype=np.float32)}
    conv = cn.Conv2d.load(cn.VarBuilder.from_tensors(tensors, device=cn.Device.cpu()), 4, 6, 3,
                          cn.Conv2dConfig(padding=1))
    x = mx.array(rng.standard_normal((2, 7, 7, 4), dtype=np.float32))
    residual = mx.array(rng.standard_normal((2, 7, 7, 6), dtype=np.float32))

    def loss(weight: mx.array) -> mx.array:
        conv.weight = weight
        y = conv(x, activation="gelu", residual=residual)
        return (cn.softmax(cn.gelu(y)) * y).sum()

    _assert_grad_matches_the_plain_ops(loss, conv.weight, path)


def test_amg_kernels_train_through_their_references(path) -> None:
    """The AMG decoder's kernels have no VJP of their own: under mx.grad the dispatcher runs
    their plain-MLX references, so the gradients are the plain ops' (a kernel reached by a
    tracer would raise instead)."""
    r = np.random.default_rng(23)

    def f32(*shape):
        return mx.array(r.standard_normal(shape).astype(np.float32))

    b, n, heads, t, d, m = 2, 40, 2, 3, 4, 8
    pe, k, shared, scale = f32(heads, n, d), f32(heads, b * t, d), f32(heads, n, d), f32(b, n)
    fold, bias, shared_v = f32(b, heads * t, m), f32(b, heads * t), f32(heads, n, 8)
    _assert_grad_matches_the_plain_ops(
        lambda x: (cn.ops.point_probs(pe, k, t, scale, shared, x, fold, bias) ** 2).sum(),
        f32(b, n, m), path)
    _assert_grad_matches_the_plain_ops(
        lambda x: cn.ops.point_pool(scale, x, fold, shared, pe, k, shared_v).sum(),
        f32(b, n, m), path)
    basis = f32(b, 16, 24)
    gram, sq = basis @ basis.swapaxes(1, 2), mx.full((n,), 100.0)
    norm_args = (f32(heads, n, d), k, f32(n), gram, 1e-5, 24, scale, f32(b, n, m),
                 f32(heads, n, 5), f32(heads, b * 4, 5))
    _assert_grad_matches_the_plain_ops(
        lambda x: (cn.ops.point_norm(x, sq, *norm_args) ** 2).sum(),
        mx.softmax(f32(b, n, heads, t), -1).reshape(b, n, -1), path)
    u, kc, c1, c2 = 2, 12, 8, 8
    scale1, shared1, weight, bias1 = f32(u, n), f32(n, 4 * c1), f32(u, kc, 4 * c1), f32(4 * c1)
    lw, lb1, w2, b2, hyper = f32(c1), f32(c1), f32(4 * c2, c1), f32(4 * c2), f32(u, 3, c2)
    _assert_grad_matches_the_plain_ops(
        lambda x: cn.ops.mask_upscale(scale1, shared1, x, weight, bias1, lw, lb1, 1e-6, w2, b2,
                                      hyper).sum(), f32(u, n, kc), path)
