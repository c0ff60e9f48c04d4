"""Regression tests for defects found while testing the candle_nn core (complements the
``test_core_*.py`` suites): float64 sources cast off the GPU, BatchNorm folding checks its
operands, the pooling modules are siblings, unreadable dtypes are named."""

from __future__ import annotations

import json
import struct

import mlx.core as mx
import numpy as np
import pytest
from conftest import rel_err

import candle_nn as cn
from candle_nn import device as cn_device

HAS_GPU = len(cn.Device.available()) > 1


@pytest.fixture
def two_devices(monkeypatch):
    """``(cpu, gpu)``: the real GPU when there is one, else a Device('gpu') object made with the
    GPU count patched (no op may run on it), un-interned afterwards."""
    if HAS_GPU:
        yield cn.Device.cpu(), cn.Device.gpu(0)
        return
    monkeypatch.setattr(cn_device, "_gpu_count", lambda: 1)
    try:
        yield cn.Device.cpu(), cn.Device("gpu")
    finally:
        cn.Device._interned.pop(("gpu", 0), None)


# -- float64 sources -----------------------------------------------------------------------------
# MLX has float64 on the CPU only; a float64 tensor (NumPy's default dtype, an F64 file) must be
# narrowed on the CPU stream even when the VarBuilder's device is a GPU.
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16], ids=str)
def test_float64_numpy_tensors_load_on_every_device(device, dtype):
    r = np.random.default_rng(0)
    w, b = r.standard_normal((6, 5)), r.standard_normal(6)  # float64, as NumPy makes them
    x = r.standard_normal((3, 5)).astype(np.float32)
    vb = cn.VarBuilder.from_tensors({"fc.weight": w, "fc.bias": b}, device=device, dtype=dtype)
    fc = cn.linear(5, 6, vb.pp("fc"))
    assert fc.weight.dtype == dtype and fc.bias.dtype == dtype
    y = fc(mx.array(x).astype(dtype))
    mx.eval(y)
    tol = 1e-6 if dtype == mx.float32 else 5e-3
    assert rel_err(np.array(y.astype(mx.float32)), x @ w.T + b) <= tol


def test_float64_safetensors_file_loads_on_every_device(device, tmp_path):
    r = np.random.default_rng(1)
    w = r.standard_normal((4, 3, 3, 3))  # conv (O, I, kH, kW), float64
    header = json.dumps({"conv.weight": {"dtype": "F64", "shape": list(w.shape),
                                         "data_offsets": [0, w.nbytes]}}).encode()
    path = tmp_path / "f64.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + w.astype("<f8").tobytes())
    vb = cn.VarBuilder.from_safetensors(path, device=device)
    conv = cn.Conv2d.load(vb.pp("conv"), 3, 4, 3, bias=False)
    assert conv.weight.dtype == mx.float32
    np.testing.assert_array_equal(np.array(conv.weight),
                                  w.astype(np.float32).transpose(0, 2, 3, 1))
    x = r.standard_normal((1, 3, 3, 3)).astype(np.float32)
    y = conv(mx.array(x))
    ref = np.einsum("nhwc,ochw->no", x.astype(np.float64), w)
    assert rel_err(np.array(y).reshape(1, 4), ref) <= 1e-6


# -- BatchNorm folding ---------------------------------------------------------------------------
def conv_on(device: cn.Device) -> cn.Conv2d:
    w = np.random.default_rng(2).standard_normal((4, 2, 3, 3)).astype(np.float32)
    return cn.Conv2d.load(cn.VarBuilder.from_tensors({"weight": w}, device=device), 2, 4, 3,
                          bias=False)


def bn_on(device: cn.Device, channels: int = 4) -> cn.BatchNorm2d:
    t = {"weight": np.ones(channels, np.float32), "bias": np.zeros(channels, np.float32),
         "running_mean": np.zeros(channels, np.float32),
         "running_var": np.ones(channels, np.float32)}
    return cn.BatchNorm2d.load(cn.VarBuilder.from_tensors(t, device=device), channels)


def test_fold_batch_norm_of_another_device_raises(two_devices):
    cpu, gpu = two_devices
    conv, bn = conv_on(cpu), bn_on(gpu)  # (no op runs on the fake GPU)
    with pytest.raises(cn.DeviceMismatchError) as info:
        conv.fold_batch_norm(bn)
    msg = str(info.value)
    assert "Conv2d.fold_batch_norm" in msg and "cpu" in msg and "gpu:0" in msg and ".to(" in msg


def test_fold_batch_norm_checks_channels_and_type():
    cpu = cn.Device.cpu()
    conv, bn1 = conv_on(cpu), bn_on(cpu, channels=1)  # would broadcast silently over 4 channels
    with pytest.raises(cn.ShapeMismatchError, match="1 channels.*4 output channels"):
        conv.fold_batch_norm(bn1)
    with pytest.raises(TypeError, match="BatchNorm2d"):
        conv.fold_batch_norm(cn.LayerNorm(None, None, device=cpu))


# -- pooling modules -----------------------------------------------------------------------------
def test_avg_pool_is_not_a_max_pool(device):
    avg, mxp = cn.AvgPool2d(2), cn.MaxPool2d(2)
    assert not isinstance(avg, cn.MaxPool2d) and not isinstance(mxp, cn.AvgPool2d)
    x = mx.array(np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1))
    with mx.stream(device.stream):
        assert np.array(avg(x)).ravel().tolist() == [2.5, 4.5, 10.5, 12.5]
        assert np.array(mxp(x)).ravel().tolist() == [5.0, 7.0, 13.0, 15.0]


# -- unreadable dtypes ---------------------------------------------------------------------------
def test_unreadable_dtype_is_named(tmp_path):
    header = json.dumps({"q": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "f8.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    vb = cn.VarBuilder.from_safetensors(path, device="cpu")
    assert vb.shape("q") == (4,)  # the header is fine; reading the data is not
    with pytest.raises(cn.WeightsFileError, match=r"cannot read tensor 'q' \(F8_E4M3\) from .*f8"):
        vb.get((4,), "q")


# -- bfloat16 files ------------------------------------------------------------------------------
def test_bfloat16_file_header_is_parsed_once(tmp_path):
    """Each bfloat16 tensor used to re-read and re-parse the whole JSON header: O(N^2) for a
    checkpoint of N tensors (2000 small tensors: 10 s instead of 0.1 s)."""
    from candle_nn import var_builder

    path = tmp_path / "bf16.safetensors"
    tensors = {f"blocks.{i}.weight": mx.random.normal((3, 2), key=mx.random.key(i)).astype(
        mx.bfloat16) for i in range(50)}
    mx.save_safetensors(str(path), tensors)
    var_builder._header.cache_clear()
    vb = cn.VarBuilder.from_safetensors(path, dtype="bf16", device="cpu")
    for name, value in tensors.items():
        got = vb.get((3, 2), name)
        assert got.dtype == mx.bfloat16 and mx.array_equal(got, value).item(), name
    assert var_builder._header.cache_info().misses == 1
    # a rewritten file is parsed again, not served from the stale cache
    tensors = {"blocks.0.weight": mx.ones((3, 2), mx.bfloat16), "x": mx.zeros((4,), mx.bfloat16)}
    mx.save_safetensors(str(path), tensors)
    vb = cn.VarBuilder.from_safetensors(path, dtype="bf16", device="cpu")
    assert mx.array_equal(vb.get((3, 2), "blocks.0.weight"), tensors["blocks.0.weight"]).item()


# -- stateless containers ------------------------------------------------------------------------
def test_stateless_container_may_not_straddle_two_devices(two_devices):
    """A Module built with device=None used to accept children of two devices silently."""
    cpu, gpu = two_devices
    eye = {"weight": np.eye(2, dtype=np.float32)}
    on_cpu = cn.linear_no_bias(2, 2, cn.VarBuilder.from_tensors(eye, device=cpu))
    on_gpu = cn.linear_no_bias(2, 2, cn.VarBuilder.from_tensors(eye, device=gpu))

    class Container(cn.Module):
        def forward(self, x):
            return self.head(self.body(x))

    box = Container()
    box.body = on_cpu
    box.pool = cn.MaxPool2d(2)  # stateless children are fine
    box.body = on_cpu  # re-assigning the same slot is fine
    with pytest.raises(cn.DeviceMismatchError) as info:
        box.head = on_gpu
    msg = str(info.value)
    assert "Container.head" in msg and "child 'body' is on cpu" in msg and "gpu:0" in msg
    assert "head" not in box
    box.body = on_gpu  # replacing the only device-bound child moves the container: fine
    box.head = on_gpu
    with pytest.raises(cn.DeviceMismatchError, match="child 'blocks' is on gpu:0"):
        other = Container()
        other.blocks = [on_gpu]
        other.head = on_cpu


# -- candle idioms -------------------------------------------------------------------------------
def test_get_accepts_an_int_shape_as_candle():
    vb = cn.VarBuilder.from_tensors({"b": np.arange(3, dtype=np.float32)}, device="cpu")
    assert vb.get(3, "b").tolist() == [0.0, 1.0, 2.0]
    assert vb.get(np.int64(3), "b").shape == (3,)
    with pytest.raises(cn.ShapeMismatchError, match=r"expects \(4,\)"):
        vb.get(4, "b")
    varmap = cn.VarMap()
    fresh = cn.VarBuilder.from_varmap(varmap, seed=0, device="cpu")
    assert fresh.get(5, "bias", cn.Init.const(1.0)).shape == (5,) and varmap["bias"].shape == (5,)
