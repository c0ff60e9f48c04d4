"""The packed-weight GEMM (candle_nn/csrc/gemm.cpp, ``conv2d_packed``) against float64 NumPy,
with each micro-kernel this CPU runs (AVX-512: 12x32 tiles, AVX2: 6x16): odd M/N/K around the
register tiles, the 16-column panels and the K blocks, padding, strides, batches, every
activation and residual mode, Linear layers with leading axes, the weight packing's layout and
cache, and gradients through the traced fallback. Where the CPU has neither (or the kernels are
not built) the packed path must say so and the layers take the other paths, which the Linear
float64 checks then cover."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from helpers.activation_reference import activation64
import candle_nn as cn
from candle_nn.backends.cpu import kernels as cpu_native, packed_gemm, weight_cache

KERNELS = cpu_native.module()
PACKED = KERNELS is not None and KERNELS.packed_gemm_available()
needs_packed = pytest.mark.skipif(not PACKED,
                                  reason="packed GEMM needs the kernels + AVX-512F or AVX2/FMA")
# the micro-kernels this CPU runs (probed, then the plan for this CPU restored)
ISAS = [isa for isa in ("avx512", "avx2") if PACKED and KERNELS.set_packed_gemm_isa(isa)]
cpu_native.apply_plan(cpu_native.plan())


@pytest.fixture(params=ISAS or ["none"])
def isa(request):
    """Runs the test with one micro-kernel, then restores this CPU's (cpu_model.py)."""
    if request.param != "none":
        assert KERNELS.set_packed_gemm_isa(request.param)
        assert KERNELS.packed_gemm_isa() == request.param
    yield request.param
    if request.param != "none":
        cpu_native.apply_plan(cpu_native.plan())
ACTS = {0: "identity", 1: "relu", 2: "silu", 3: "gelu", 4: "sigmoid"}


def _conv64(x: np.ndarray, w: np.ndarray, stride: tuple[int, int],
            pad: tuple[int, int]) -> np.ndarray:
    """float64 conv: x (N, H, W, C), w (O, kH, kW, C) -> (N, H', W', O)."""
    n, h, wd, _ = x.shape
    o, kh, kw, _ = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (pad[0], pad[0]), (pad[1], pad[1]), (0, 0)))
    oh, ow = (h + 2 * pad[0] - kh) // stride[0] + 1, (wd + 2 * pad[1] - kw) // stride[1] + 1
    y = np.zeros((n, oh, ow, o))
    for i in range(kh):
        for j in range(kw):
            tap = xp[:, i:i + stride[0] * (oh - 1) + 1:stride[0],
                     j:j + stride[1] * (ow - 1) + 1:stride[1], :]
            y += tap @ w[:, i, j, :].astype(np.float64).T
    return y


# (batch, H, W, C, O, kH, kW, stride, padding): M = batch * H' * W' from 1 to a few hundred
# (tails of the 12-row tile), O across the 16/32-column panels, K across the 512-wide K blocks,
# problems below and above the size that goes multithreaded (2 MFLOP).
SHAPES = [
    (1, 7, 7, 64, 512, 1, 1, (1, 1), (0, 0)),
    (1, 1, 1, 17, 1000, 1, 1, (1, 1), (0, 0)),
    (2, 9, 11, 5, 7, 3, 3, (2, 2), (1, 1)),
    (1, 13, 5, 33, 37, 3, 3, (1, 1), (1, 1)),
    (3, 6, 6, 300, 50, 2, 3, (1, 2), (0, 1)),
    (1, 32, 32, 16, 16, 3, 3, (2, 2), (1, 1)),
    (1, 5, 5, 600, 33, 3, 3, (1, 1), (1, 1)),
    (1, 4, 4, 3, 1, 7, 7, (2, 2), (3, 3)),
    (2, 12, 12, 24, 48, 1, 1, (2, 2), (0, 0)),
    (1, 3, 29, 1100, 15, 1, 1, (1, 1), (0, 0)),
    (1, 5, 5, 40, 200, 3, 3, (1, 1), (1, 1)),  # few rows, columns split: im2col gathered once
    # wide outputs: tiles that read x in place, tiles at the image borders and output-row ends
    # gathered, tiles above/below the image skipped per kernel row
    (1, 9, 40, 16, 20, 3, 3, (1, 1), (1, 1)),
    (2, 50, 50, 12, 24, 3, 3, (2, 2), (1, 1)),
    (1, 11, 37, 8, 40, 5, 5, (1, 1), (2, 2)),
    (1, 4, 30, 32, 17, 1, 1, (1, 1), (1, 1)),  # padded 1x1: whole output rows are bias only
    (1, 6, 64, 600, 48, 3, 3, (1, 1), (1, 1)),  # kernel rows split into K chunks
    # row tiles of near-equal heights instead of a few-row remainder: M = 49 (6 and 5 rows /
    # 10 and 9), x read in place; M = 98 and 13
    (1, 7, 7, 64, 40, 3, 3, (1, 1), (1, 1)),
    (2, 7, 7, 48, 24, 1, 1, (1, 1), (0, 0)),
    (1, 1, 13, 32, 20, 3, 3, (1, 1), (1, 1)),
]


@needs_packed
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("act,mode", [(0, 0), (1, 1), (2, 0), (3, 2), (2, 1), (4, 1)])
def test_conv2d_packed_against_float64(isa, shape, act, mode) -> None:
    """Every output within 1e-5 of the output's max of a float64 conv + epilogue."""
    n, h, wd, c, o, kh, kw, stride, pad = shape
    rng = np.random.default_rng(sum(shape[:7]) * 7 + act * 3 + mode)
    x = rng.standard_normal((n, h, wd, c), dtype=np.float32)
    w = (rng.standard_normal((o, kh, kw, c)) / np.sqrt(kh * kw * c)).astype(np.float32)
    bias = rng.standard_normal(o, dtype=np.float32)
    v = _conv64(x, w, stride, pad) + bias
    residual = rng.standard_normal(v.shape, dtype=np.float32)
    ref = activation64(v + (residual if mode == 1 else 0.0), ACTS[act]) + (
        residual if mode == 2 else 0.0)
    with mx.stream(mx.cpu):
        packed = KERNELS.pack_gemm_weight(mx.array(w).reshape(o, -1))
        ours = KERNELS.conv2d_packed(mx.array(x), packed, mx.array(bias),
                                     mx.array(residual) if mode else None, (kh, kw), o, stride,
                                     pad, act, mode)
        ours = np.array(ours)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-5 * max(np.abs(ref).max(), 1.0), (shape, act, mode)


@needs_packed
def test_conv2d_packed_without_bias_on_a_strided_input(isa) -> None:
    """No bias, no epilogue; x a non-contiguous slice (made contiguous by the op)."""
    rng = np.random.default_rng(5)
    big = rng.standard_normal((1, 10, 20, 8), dtype=np.float32)
    w = rng.standard_normal((21, 3, 3, 8), dtype=np.float32)
    x = big[:, :, ::2, :]
    ref = _conv64(x, w, (1, 1), (1, 1))
    with mx.stream(mx.cpu):
        ours = np.array(KERNELS.conv2d_packed(
            mx.array(big)[:, :, ::2, :], KERNELS.pack_gemm_weight(mx.array(w).reshape(21, -1)),
            None, None, (3, 3), 21, (1, 1), (1, 1)))
    assert np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max()


@needs_packed
def test_packed_layout_is_16_column_panels() -> None:
    """out[p * 16 * K + k * 16 + j] = w[p * 16 + j, k], zeros past N (gemm.h's contract)."""
    w = np.arange(37 * 5, dtype=np.float32).reshape(37, 5) + 1.0
    packed = np.array(KERNELS.pack_gemm_weight(mx.array(w)))
    expect = np.zeros((48, 5), np.float32)
    expect[:37] = w
    assert packed.shape == (3 * 16 * 5,)
    np.testing.assert_array_equal(packed, expect.reshape(3, 16, 5).transpose(0, 2, 1).ravel())


@needs_packed
def test_bad_arguments_are_refused() -> None:
    x = mx.zeros((1, 4, 4, 3))
    packed = KERNELS.pack_gemm_weight(mx.zeros((5, 27)))
    with pytest.raises(ValueError, match="pack_gemm_weight"):
        KERNELS.conv2d_packed(x, packed, None, None, (3, 3), 17, (1, 1), (1, 1))  # 2 panels
    with pytest.raises(ValueError, match="bias"):
        KERNELS.conv2d_packed(x, packed, mx.zeros(4), None, (3, 3), 5, (1, 1), (1, 1))
    with pytest.raises(ValueError, match="float32"):
        KERNELS.conv2d_packed(x.astype(mx.float16), packed, None, None, (3, 3), 5, (1, 1), (1, 1))


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("activation", ["silu", "gelu", None])
def test_linear_against_float64(isa, packed: bool, activation: str | None) -> None:
    """Linear on (2, 5, 7, in) with in = 333 and out = 70: the packed GEMM (where it runs) and
    the MLX matmul path, within 1e-5 of the output's max."""
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((70, 333)) / 18).astype(np.float32)
    b = rng.standard_normal(70, dtype=np.float32)
    x = rng.standard_normal((2, 5, 7, 333), dtype=np.float32)
    layer = cn.Linear.load(cn.VarBuilder.from_tensors({"weight": w, "bias": b},
                                                      device=cn.Device.cpu()), 333, 70)
    ref = activation64(x.astype(np.float64) @ w.T.astype(np.float64) + b, activation)
    with cn.ops.disabled(*(() if packed else ("packed_gemm",))), mx.stream(mx.cpu):
        row = next(r for r in cn.ops.status() if r["op"] == "linear"
                   and r["name"] == "packed_gemm")
        assert (row["enabled"] and row["available"]) is (packed and PACKED)
        ours = np.array(layer(mx.array(x), activation=activation))
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max()


@needs_packed
def test_packing_is_cached_per_weight_array() -> None:
    """The same array object is packed once; a new array (a new weight) is packed again."""
    w = mx.array(np.ones((20, 9), np.float32))
    with mx.stream(mx.cpu):
        first = packed_gemm.packed_weight(w)
        assert packed_gemm.packed_weight(w) is first
        cached = weight_cache.size("packed_gemm")
        w2 = w * 2.0
        assert float(packed_gemm.packed_weight(w2)[0]) == 2.0
        assert weight_cache.size("packed_gemm") == cached + 1
    del w2
    assert weight_cache.size("packed_gemm") == cached


def test_linear_gradients_match_the_plain_ops() -> None:
    """mx.grad through Linear's fast path (traced: the packing and conv in MLX ops) equals the
    plain ops' gradient w.r.t. weight and input."""
    rng = np.random.default_rng(3)
    w = mx.array(rng.standard_normal((19, 40), dtype=np.float32))
    b = mx.array(rng.standard_normal(19, dtype=np.float32))
    x = mx.array(rng.standard_normal((3, 40), dtype=np.float32))
    layer = cn.Linear(w, b, device=cn.Device.cpu())

    def loss(weight: mx.array, inputs: mx.array) -> mx.array:
        layer.weight = weight
        return (layer(inputs, activation="silu") ** 2).sum()

    with mx.stream(mx.cpu):
        ours = mx.grad(loss, argnums=(0, 1))(w, x)
        with cn.ops.disabled("cpu"):
            plain = mx.grad(loss, argnums=(0, 1))(w, x)
    for a, p in zip(ours, plain):
        a, p = np.array(a), np.array(p)
        assert np.abs(a - p).max() <= 1e-4 * np.abs(p).max()


def test_the_micro_kernel_is_this_cpus() -> None:
    """The one cpu_model.py plans for this CPU (AVX-512F or AVX2 + FMA), else none (and the
    layers use BLAS)."""
    if not PACKED:
        assert KERNELS is None or KERNELS.packed_gemm_isa() == "none"
        assert not packed_gemm.available()
        return
    assert KERNELS.packed_gemm_isa() == cpu_native.plan().gemm in ISAS
    assert not KERNELS.set_packed_gemm_isa("sse2")


def test_info_names_the_conv_gemm() -> None:
    """``candle_nn.info()`` says what convs and Linear layers multiply with, and follows the
    switch."""
    expect = f"packed {KERNELS.packed_gemm_isa()}" if PACKED else "blas"
    assert cn.info()["cpu_gemm"] == expect
    with cn.ops.disabled("packed_gemm"):
        assert cn.info()["cpu_gemm"] == "blas"


@pytest.mark.parametrize("shape", [(0, 6), (6,), (2, 0, 6)])
def test_linear_on_empty_and_vector_inputs(shape: tuple[int, ...]) -> None:
    """No rows at all, or one vector: the float64 result's shape and values."""
    rng = np.random.default_rng(8)
    w = rng.standard_normal((4, 6), dtype=np.float32)
    b = rng.standard_normal(4, dtype=np.float32)
    x = rng.standard_normal(shape, dtype=np.float32)
    layer = cn.Linear(mx.array(w), mx.array(b), device=cn.Device.cpu())
    with mx.stream(mx.cpu):
        ours = np.array(layer(mx.array(x), activation="relu"))
    ref = np.maximum(x.astype(np.float64) @ w.T + b, 0.0)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max(initial=0.0) <= 1e-5 * max(np.abs(ref).max(initial=0.0), 1.0)
