"""The CUDA fast paths (backends/cuda/kernels.py) against float64 NumPy references, on every
device: on a CUDA GPU the layers run the hand-written kernels, elsewhere MLX's own ops, and both
must meet the same reference. ``CANDLE_NN_CUDA_KERNELS`` switches the kernels off (or keeps
some)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import candle_nn as cn
from candle_nn import config
from candle_nn.backends.cuda import kernels as cuda_kernels
from candle_nn_models.yolo_v8_head import Dfl

DTYPES = [(mx.float32, 1e-5), (mx.float16, 5e-3)]


def _rel(got: mx.array, ref: np.ndarray) -> float:
    got = np.array(got.astype(mx.float32), dtype=np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _depthwise_ref(x, w, b, stride, pad):
    n, h, wd, c = x.shape
    _, kh, kw, _ = w.shape
    xp = np.pad(x, [(0, 0), (pad, pad), (pad, pad), (0, 0)])
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, oh, ow, c)) + b
    for i in range(kh):
        for j in range(kw):
            out += xp[:, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride] \
                * w[:, i, j, 0]
    return out


@pytest.fixture(params=["default", "forced"])
def kernel_switch(request, monkeypatch):
    """``forced``: ``CANDLE_NN_CUDA_KERNELS`` names every kernel, so that on a CUDA GPU they
    also run in the dtypes they are not the default for (float16 depthwise)."""
    if request.param == "forced":
        monkeypatch.setenv("CANDLE_NN_CUDA_KERNELS", "depthwise,dfl,max_pool,softmax")
    config.reload()
    yield request.param
    monkeypatch.delenv("CANDLE_NN_CUDA_KERNELS", raising=False)
    config.reload()


@pytest.mark.parametrize("dtype,tol", DTYPES, ids=["float32", "float16"])
@pytest.mark.parametrize("channels,stride,width", [(64, 1, 11), (160, 2, 11), (6, 1, 11),
                                                   (7, 2, 11), (16, 1, 4), (24, 2, 9)])
@pytest.mark.parametrize("columns", [None, 2, 4])
def test_depthwise_conv_matches_reference(device, kernel_switch, monkeypatch, dtype, tol,
                                          channels, stride, width, columns):
    """``columns``: output pixels per thread of the CUDA kernel, forced on these small shapes
    (None: what the kernel picks)."""
    if columns is not None:
        monkeypatch.setattr(cuda_kernels, "_DEPTHWISE_COLUMNS", (columns,))
        monkeypatch.setattr(cuda_kernels, "_FULL_GRID", 1)
    rng = np.random.default_rng(channels + stride)
    x = rng.standard_normal((2, 13, width, channels))
    w = rng.standard_normal((channels, 3, 3, 1)) * 0.3
    b = rng.standard_normal(channels)
    layer = cn.Conv2d(mx.array(w, dtype=dtype), mx.array(b, dtype=dtype),
                      cn.Conv2dConfig(padding=1, stride=stride, groups=channels), device=device)
    ref = _depthwise_ref(np.array(mx.array(x, dtype=dtype).astype(mx.float32), dtype=np.float64),
                         np.array(mx.array(w, dtype=dtype).astype(mx.float32), dtype=np.float64),
                         np.array(mx.array(b, dtype=dtype).astype(mx.float32), dtype=np.float64),
                         stride, 1)
    assert _rel(layer(mx.array(x, dtype=dtype)), ref) < tol


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_conv_nonfinite_weights_skip_the_padding(device, kernel_switch, stride):
    """Padding is implicit, as in MLX's conv (and PyTorch's): a tap that falls outside the image
    adds nothing, so a NaN or +-Inf weight does not reach the outputs whose window holds it only
    over the padding (an explicit 0 * NaN would make them NaN)."""
    rng = np.random.default_rng(5)
    x = np.array(mx.array(rng.standard_normal((1, 9, 10, 16)), dtype=mx.float32), np.float64)
    w = rng.standard_normal((16, 3, 3, 1)) * 0.3
    w[1, 0, 1, 0], w[2, 2, 2, 0], w[3, 1, 0, 0] = np.nan, np.inf, -np.inf
    b = rng.standard_normal(16)
    layer = cn.Conv2d(mx.array(w, dtype=mx.float32), mx.array(b, dtype=mx.float32),
                      cn.Conv2dConfig(padding=1, stride=stride, groups=16), device=device)
    got = np.array(layer(mx.array(x, dtype=mx.float32)), dtype=np.float64)
    xp = np.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)])
    inside = np.pad(np.ones(x.shape, bool), [(0, 0), (1, 1), (1, 1), (0, 0)])
    oh, ow = (x.shape[1] - 1) // stride + 1, (x.shape[2] - 1) // stride + 1
    ref = np.zeros((1, oh, ow, 16)) + b
    for i in range(3):
        for j in range(3):
            rows = slice(i, i + stride * (oh - 1) + 1, stride)
            cols = slice(j, j + stride * (ow - 1) + 1, stride)
            with np.errstate(invalid="ignore"):
                ref += np.where(inside[:, rows, cols], xp[:, rows, cols] * w[:, i, j, 0], 0.0)
    for where in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(where(got), where(ref), err_msg=where.__name__)
    finite = np.isfinite(ref)
    assert np.abs(got[finite] - ref[finite]).max() < 1e-5 * np.abs(ref[finite]).max()


@pytest.mark.parametrize("dtype,tol", DTYPES, ids=["float32", "float16"])
@pytest.mark.parametrize("kernel,stride,pad", [(3, 2, 1), (5, 1, 2)])
def test_max_pool_matches_reference(device, dtype, tol, kernel, stride, pad):
    x = np.random.default_rng(kernel).standard_normal((2, 9, 10, 64)) - 2.0  # mostly negative
    xq = np.array(mx.array(x, dtype=dtype).astype(mx.float32), dtype=np.float64)
    xp = np.pad(xq, [(0, 0), (pad, pad), (pad, pad), (0, 0)], constant_values=-np.inf)
    oh, ow = (9 + 2 * pad - kernel) // stride + 1, (10 + 2 * pad - kernel) // stride + 1
    ref = np.full((2, oh, ow, 64), -np.inf)
    for i in range(kernel):
        for j in range(kernel):
            ref = np.maximum(ref, xp[:, i:i + stride * (oh - 1) + 1:stride,
                                     j:j + stride * (ow - 1) + 1:stride])
    with mx.stream(device.stream):
        got = cn.max_pool2d(mx.array(x, dtype=dtype), kernel, stride, pad)
    assert _rel(got, ref) == 0.0  # a max is exact


@pytest.mark.parametrize("dtype,tol", DTYPES, ids=["float32", "float16"])
def test_dfl_decoding_matches_reference(device, dtype, tol):
    x = np.random.default_rng(3).standard_normal((2, 37, 64)) * 3
    weight = np.arange(16, dtype=np.float64)
    dfl = Dfl(cn.Conv2d(mx.array(weight.reshape(1, 1, 1, 16), dtype=dtype), None, device=device))
    xq = np.array(mx.array(x, dtype=dtype).astype(mx.float32), dtype=np.float64)
    xq = xq.reshape(2, 37, 4, 16)
    e = np.exp(xq - xq.max(-1, keepdims=True))
    ref = (e / e.sum(-1, keepdims=True)) @ weight
    assert _rel(dfl(mx.array(x, dtype=dtype)), ref) < tol


@pytest.mark.parametrize("dtype,tol", DTYPES, ids=["float32", "float16"])
@pytest.mark.parametrize("length", [1, 7, 32, 33])
def test_short_softmax_matches_reference(device, dtype, tol, length):
    """The softmax op over short last axes (the CUDA kernel up to 32, MLX's beyond) against
    float64, non-finite rows as MLX's softmax has them, and its gradient as the reference's."""
    x = np.random.default_rng(length).standard_normal((3, 50, length)) * 4
    x[0, 0, 0], x[0, 1, :] = np.nan, -np.inf
    xq = np.array(mx.array(x, dtype=dtype).astype(mx.float32), dtype=np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(xq - xq.max(-1, keepdims=True))
        ref = e / e.sum(-1, keepdims=True)
    with mx.stream(device.stream):
        got = cn.ops.softmax(mx.array(x, dtype=dtype))
        plain = mx.softmax(mx.array(x, dtype=dtype), axis=-1, precise=True)
        got_nan = np.isnan(np.array(got.astype(mx.float32)))
        assert (got_nan == np.isnan(np.array(plain.astype(mx.float32)))).all()
        assert got_nan[0, 0].all() and got_nan[0, 1].all()
        assert _rel(got[1:], ref[1:]) < tol
        w = mx.array(np.random.default_rng(0).standard_normal(x.shape[1:]), dtype=mx.float32)
        xf = mx.array(x[1:], dtype=mx.float32)
        grads = [mx.grad(lambda v, f=f: (f(v) * w).sum())(xf) for f in
                 (cn.ops.softmax, lambda v: mx.softmax(v, axis=-1, precise=True))]
        np.testing.assert_allclose(np.array(grads[0]), np.array(grads[1]), rtol=1e-5, atol=1e-6)


def test_short_softmax_leaves_arrays_past_32_bit_offsets_to_mlx(monkeypatch):
    """The kernel indexes with 32-bit offsets: an array of 2**31 elements or more must not
    reach it (it would skip rows silently). Shapes only, no memory; the device check is
    patched to "a CUDA GPU" so that only the size decides, on any machine."""
    from candle_nn.backends import cuda as cuda_backend

    class Shaped:  # what _softmax_applies reads of an array
        def __init__(self, shape):
            self.shape, self.ndim, self.dtype = shape, len(shape), mx.float32
            self.size = int(np.prod(shape))

    monkeypatch.setattr(cuda_kernels, "on_cuda", lambda kernel, dtype=None: True)
    assert cuda_backend._softmax_applies(Shaped((64, 4096, 8, 7)))
    assert cuda_backend._softmax_applies(Shaped((2**31 - 1, 1)))
    assert not cuda_backend._softmax_applies(Shaped((2**28, 8, 1)))
    assert not cuda_backend._softmax_applies(Shaped((2**29, 4, 7)))
    assert not cuda_backend._softmax_applies(Shaped((64, 4096, 8, 33)))


def test_kernels_follow_the_switch_and_the_device(monkeypatch):
    with mx.stream(mx.cpu):
        assert not any(cuda_kernels.on_cuda(k) for k in ("depthwise", "dfl", "max_pool",
                                                          "softmax"))
    gpu = [d for d in cn.Device.available() if d.stream.device.type == mx.DeviceType.gpu]
    for device in gpu:  # by default: the dtypes each kernel was measured faster in
        with mx.stream(device.stream):
            assert not cuda_kernels.on_cuda("depthwise", mx.float16)
            assert cuda_kernels.on_cuda("max_pool", mx.float16) == cuda_kernels._cuda_backend()
    with cn.ops.disabled("cuda"):
        assert not any(r["enabled"] for r in cn.ops.status() if r["backend"] == "cuda")
    assert all(r["enabled"] for r in cn.ops.status() if r["backend"] == "cuda")
    monkeypatch.setenv("CANDLE_NN_CUDA_KERNELS", "dfl,max_pool")
    config.reload()
    try:
        assert config.cuda_kernels() == ("named", frozenset({"dfl", "max_pool"}))
        for device in gpu:
            with mx.stream(device.stream):
                assert cuda_kernels.on_cuda("dfl", mx.float16) == cuda_kernels._cuda_backend()
    finally:
        monkeypatch.delenv("CANDLE_NN_CUDA_KERNELS")
        config.reload()
