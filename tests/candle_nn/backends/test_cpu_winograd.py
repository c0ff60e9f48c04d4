"""Winograd F(4x4, 3x3) for 3x3 stride-1 convs (backends/cpu/winograd.py, csrc/winograd.cpp) against
float64 NumPy convolution; which convs take it; the weight cache; and MLX transforms.

Bound: F(4x4, 3x3) in float32 is measured at 1e-6 to 1e-5 of the output's max |value| (im2col
~5e-7); the tests allow 2e-5 of max |value| (the fixtures allow 1e-4). Without the compiled
kernels there is no Winograd path (convs stay on MLX's own); then only that is checked.
"""

from __future__ import annotations

import gc
import math

import mlx.core as mx
import numpy as np
import pytest

from helpers.activation_reference import activation64
from helpers.thread_bits import assert_same_bits_on_1_2_3_threads
import candle_nn as cn
from candle_nn.backends.cpu import kernels as cpu_native, weight_cache
from candle_nn.backends.cpu import winograd as cpu_winograd

NATIVE = cpu_native.module() is not None and cpu_native.has_sgemm()
REL_BOUND = 2e-5
needs_native = pytest.mark.skipif(not NATIVE, reason="the compiled kernels are not built here")


def _conv64(x: np.ndarray, w: np.ndarray, padding: tuple[int, int]) -> np.ndarray:
    """float64 cross-correlation, stride 1: x (N, H, W, C), w (O, 3, 3, C) -> (N, H', W', O)."""
    (ph, pw) = padding
    xp = np.pad(x.astype(np.float64), [(0, 0), (ph, ph), (pw, pw), (0, 0)])
    windows = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(1, 2))
    return np.einsum("nhwcij,oijc->nhwo", windows, w.astype(np.float64))


def _data(n: int, h: int, w: int, c: int, o: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    wt = (rng.standard_normal((o, 3, 3, c)) / math.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    return x, wt, b


@needs_native
@pytest.mark.parametrize("avx512", ["auto", "0"])
@pytest.mark.parametrize("act", ["identity", "relu", "silu", "gelu"])
@pytest.mark.parametrize("mode", ["none", "before", "after"])
@pytest.mark.parametrize("n, h, w, c, o, padding", [
    (1, 17, 19, 5, 3, (1, 1)),      # odd sizes, channels below one vector, partial tiles
    (2, 13, 22, 16, 24, (1, 0)),    # batch 2, asymmetric padding
    (1, 30, 9, 20, 13, (2, 1)),     # padding 2, channel tails on both sides
    (3, 10, 10, 64, 56, (0, 0)),    # no padding; 32 + 16 + 8 output channels
])
def test_winograd_conv_against_float64(avx512, act, mode, n, h, w, c, o, padding) -> None:
    """``avx512="0"``: the AVX2 GEMM also where the CPU has AVX-512 (``CANDLE_NN_CPU_ISA=avx2``
    sets the same switch)."""
    cpu_native.module().set_winograd_avx512(avx512 != "0")
    x, wt, b = _data(n, h, w, c, o, seed=h * w + c)
    ref = _conv64(x, wt, padding) + b
    r = np.random.default_rng(1).standard_normal(ref.shape).astype(np.float32)
    residual = None if mode == "none" else mx.array(r)
    with mx.stream(mx.cpu):
        kernels = cpu_native.module()
        u = kernels.winograd_weights(mx.array(wt))
        ours = np.array(kernels.winograd_conv3x3(
            mx.array(x), mx.array(wt), u, mx.array(b), residual, padding,
            {"identity": 0, "relu": 1, "silu": 2, "gelu": 3}[act],
            {"none": 0, "before": 1, "after": 2}[mode]))
    cpu_native.apply_plan(cpu_native.plan())
    if mode == "before":
        ref = ref + r
    ref = activation64(ref, act) + (r if mode == "after" else 0)
    assert ours.shape == ref.shape and ours.dtype == np.float32
    err = np.abs(ours - ref).max() / np.abs(ref).max()
    assert err <= REL_BOUND, err


@needs_native
@pytest.mark.parametrize("avx512", ["auto", "0"])
@pytest.mark.parametrize("n, h, c, o", [
    (1, 14, 64, 104),   # 16 tiles, one block: shares of 64 + 40 output channels
    (2, 10, 24, 200),   # 18 tiles: 128 + 72 (2 threads), 96 + 96 + 8 (3 threads)
])
def test_winograd_splits_output_channels_over_threads_with_the_same_bits(avx512, n, h, c, o
                                                                        ) -> None:
    """Few tiles and several threads: tasks take shares of the output channels (each reading its
    part of U) instead of smaller tile blocks. Every output is computed the same way on 1, 2 and
    3 threads (same bits), equal to float64 to the bound, with the non-finite fallbacks (a NaN
    input pixel: its tiles by the direct conv; an Inf weight in the second share, a -Inf and a
    NaN one at corner taps in the first: those channels by the direct conv) restricted to each
    task's channels."""
    cpu_native.module().set_winograd_avx512(avx512 != "0")
    x, wt, b = _data(n, h, h, c, o, seed=c + o)
    x[0, 5, 6, 3] = np.nan
    wt[o - 3, 1, 2, 0] = np.inf
    wt[1, 0, 0, c - 1] = -np.inf
    wt[40, 2, 2, 5] = np.nan
    r = np.random.default_rng(2).standard_normal((n, h, h, o)).astype(np.float32)
    kernels = cpu_native.module()

    def run() -> list[mx.array]:
        u = kernels.winograd_weights(mx.array(wt))
        return [kernels.winograd_conv3x3(mx.array(x), mx.array(wt), u, mx.array(b), mx.array(r),
                                         (1, 1), 1, 1)]

    try:
        (ours,) = assert_same_bits_on_1_2_3_threads(run)
    finally:
        cpu_native.apply_plan(cpu_native.plan())
    with np.errstate(invalid="ignore"):
        ref = np.maximum(_conv64(x, wt, (1, 1)) + b + r, 0)
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(ours[~finite], ref[~finite])  # NaN where NaN, same-sign Inf
    assert np.isinf(ours[..., o - 3]).any() and np.isnan(ours[0, 4:7, 5:8]).all()
    assert np.isinf(ours[..., 1]).any() and np.isnan(ours[..., 40]).all()
    err = np.abs(ours[finite] - ref[finite]).max() / np.abs(ref[finite]).max()
    assert err <= REL_BOUND, err


@needs_native
def test_conv2d_layer_takes_winograd_and_matches_mlx() -> None:
    """A 3x3 stride-1 ``Conv2d`` on the CPU goes through Winograd (its weights get transformed),
    equal (to the bound) to MLX's own conv with every fast path off; stride 2 convs do not."""
    before = weight_cache.size("winograd")
    x, wt, b = _data(2, 24, 20, 16, 32, seed=4)
    device = cn.Device.cpu()
    layer = cn.Conv2d(mx.array(wt), mx.array(b), cn.Conv2dConfig(padding=1), device=device)
    strided = cn.Conv2d(mx.array(wt), mx.array(b), cn.Conv2dConfig(padding=1, stride=2),
                        device=device)
    with layer.on_device():
        ours = np.array(layer(mx.array(x), activation="silu"))
        assert weight_cache.size("winograd") == before + 1
        strided2 = cn.Conv2d(mx.array(wt) * 2, mx.array(b), cn.Conv2dConfig(padding=1, stride=2),
                             device=device)
        strided(mx.array(x)), strided2(mx.array(x))
        assert weight_cache.size("winograd") == before + 1
        with cn.ops.disabled("cpu"):
            plain = np.array(layer(mx.array(x), activation="silu"))
    assert np.abs(ours - plain).max() <= REL_BOUND * np.abs(plain).max()


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, expected", [
    ((1, 16, 16, 256), (256, 3, 3, 256), (1, 1), (1, 1), True),   # 16 tiles
    ((1, 12, 12, 256), (256, 3, 3, 256), (1, 1), (1, 1), False),  # 9 tiles, wide: im2col
    ((1, 12, 12, 128), (128, 3, 3, 128), (1, 1), (1, 1), True),   # 9 tiles, narrow
    ((2, 12, 12, 256), (256, 3, 3, 256), (1, 1), (1, 1), True),   # 18 tiles over the batch
    ((1, 7, 7, 512), (512, 3, 3, 512), (1, 1), (1, 1), False),    # ResNet-50's last stage
    ((1, 2, 2, 8), (8, 3, 3, 8), (1, 1), (0, 0), False),          # no output
    ((1, 64, 64, 8), (8, 3, 3, 8), (2, 2), (1, 1), False),    # stride 2
    ((1, 64, 64, 8), (8, 1, 1, 8), (1, 1), (0, 0), False),    # 1x1
])
def test_which_convs_take_winograd(x_shape, w_shape, stride, padding, expected) -> None:
    with mx.stream(mx.cpu):
        assert cpu_winograd.applies(mx.zeros(x_shape), mx.zeros(w_shape), None, stride,
                                    padding) is expected
    with cn.ops.disabled("winograd"):
        assert not next(r for r in cn.ops.status() if r["name"] == "winograd")["enabled"]


@needs_native
def test_weights_are_transformed_once_and_dropped_with_the_weight() -> None:
    _, wt, _ = _data(1, 1, 1, 12, 10, seed=2)
    weight = mx.array(wt)
    u = cpu_winograd.transformed_weights(weight)
    assert cpu_winograd.transformed_weights(weight) is u
    assert u.shape == (36, 16, 16)
    # the zero padding past C and O, and one transformed value against float64 G w G^T
    u_np = np.array(u)
    assert not u_np[:, 12:, :].any() and not u_np[:, :, 10:].any()
    g = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])
    u64 = np.einsum("ai,oijc,bj->abco", g, wt.astype(np.float64), g).reshape(36, 12, 10)
    np.testing.assert_allclose(u_np[:, :12, :10], u64, rtol=1e-6, atol=1e-7)
    cached = weight_cache.size("winograd")
    del weight
    gc.collect()
    assert weight_cache.size("winograd") == cached - 1


@needs_native
@pytest.mark.parametrize("argnums", [(0,), (0, 1)])
def test_gradients_through_a_winograd_conv_match_mlx(argnums) -> None:
    """Under ``mx.grad`` the primitive has no vjp: the conv falls back to MLX's ops (a traced x:
    in winograd_conv3x3; a traced weight: it is never transformed)."""
    x, wt, b = _data(1, 18, 18, 8, 8, seed=9)
    with mx.stream(mx.cpu):
        def loss(xx, ww):
            return cn.ops.conv2d(xx, ww, mx.array(b), (1, 1), (1, 1),
                                 activation="silu").sum()

        def plain(xx, ww):
            y = mx.conv2d(xx, ww, padding=1) + mx.array(b)
            return (y * mx.sigmoid(y)).sum()

        ours = mx.grad(loss, argnums=argnums)(mx.array(x), mx.array(wt))
        ref = mx.grad(plain, argnums=argnums)(mx.array(x), mx.array(wt))
    for a, r in zip(ours, ref):
        np.testing.assert_allclose(np.array(a), np.array(r), rtol=1e-4, atol=1e-5)
