"""VarBuilder and VarMap: prefixes, queries, lazy loading, dtype casts, several files, every error
path and the text of its message, and the VarMap save/load round trip."""

from __future__ import annotations

import json
import struct

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import save_file

import candle_nn as cn
from candle_nn import safetensors_io, var_builder
from conftest import rel_err


def bits(a: mx.array) -> np.ndarray:
    """The raw bits of an MLX array (works for bfloat16, which NumPy lacks)."""
    view = {mx.float32: mx.uint32, mx.float16: mx.uint16, mx.bfloat16: mx.uint16}[a.dtype]
    return np.array(a.view(view))


@pytest.fixture
def model_file(tmp_path):
    r = np.random.default_rng(0)
    tensors = {
        "encoder.layer1.0.conv1.weight": r.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "encoder.layer1.0.conv1.bias": r.standard_normal(4).astype(np.float32),
        "encoder.layer1.1.conv1.weight": r.standard_normal((4, 4, 3, 3)).astype(np.float32),
        "head.weight": r.standard_normal((2, 4)).astype(np.float32),
        "head.ids": np.arange(5, dtype=np.int64),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"candle_nn.model": "toy"})
    return path, tensors


# -- navigation and queries ----------------------------------------------------------------------
def test_pp_with_str_and_int_and_prefix(model_file):
    path, tensors = model_file
    vb = cn.VarBuilder.from_safetensors(path, device="cpu")
    assert vb.prefix == "" and vb.device == cn.Device.cpu() and vb.dtype == mx.float32
    sub = vb.pp("encoder").pp("layer1").pp(0)
    assert sub.prefix == "encoder.layer1.0"
    assert sub.path("conv1.weight") == "encoder.layer1.0.conv1.weight"
    assert vb.push_prefix("head").prefix == "head"
    w = sub.pp("conv1").get((4, 3, 3, 3), "weight")
    np.testing.assert_array_equal(np.array(w), tensors["encoder.layer1.0.conv1.weight"])
    assert sub.get(None, "conv1.bias").shape == (4,)  # dotted names and shape=None work too
    # pp never mutates its parent
    assert vb.prefix == "" and sub.prefix == "encoder.layer1.0"


def test_contains_shape_names_metadata(model_file):
    path, tensors = model_file
    vb = cn.VarBuilder.from_safetensors(str(path))
    enc = vb.pp("encoder")
    assert enc.contains("layer1.1.conv1.weight") and not enc.contains("head.weight")
    assert vb.pp("encoder").pp("layer1").pp(1).contains("conv1.weight")
    assert enc.shape("layer1.1.conv1.weight") == (4, 4, 3, 3)
    assert sorted(enc.names()) == sorted(n for n in tensors if n.startswith("encoder."))
    assert sorted(vb.names()) == sorted(tensors)
    # a prefix matches whole components only
    assert vb.pp("head").names() == ["head.weight", "head.ids"] or \
        sorted(vb.pp("head").names()) == ["head.ids", "head.weight"]
    assert vb.pp("hea").names() == []
    assert vb.metadata == {"candle_nn.model": "toy"}
    assert vb.accessed() == set()  # queries read no tensor
    assert "model.safetensors" in repr(vb)


def test_lazy_loading_reads_only_requested_tensors(tmp_path, monkeypatch):
    tensors = {f"blocks.{i}.weight": np.full((8, 8), i, np.float32) for i in range(300)}
    path = tmp_path / "many.safetensors"
    save_file(tensors, str(path))
    reads = []
    real_read = var_builder.read_tensor

    def spy(handle, file, name):
        reads.append(name)
        return real_read(handle, file, name)

    monkeypatch.setattr(var_builder, "read_tensor", spy)
    vb = cn.VarBuilder.from_safetensors(path)
    assert vb.accessed() == set() and reads == []
    assert vb.shape("blocks.5.weight") == (8, 8) and vb.contains("blocks.299.weight")
    assert reads == []  # shapes and names come from the header
    got = vb.pp("blocks").pp(17).get((8, 8), "weight")
    vb.pp("blocks").pp(250).get((8, 8), "weight")
    assert float(got[0, 0]) == 17.0
    assert vb.accessed() == {"blocks.17.weight", "blocks.250.weight"}
    assert reads == ["blocks.17.weight", "blocks.250.weight"]  # the other 298 were never read
    assert vb.pp("blocks").accessed() == vb.accessed()  # shared with children


def test_integer_tensors_are_refused_as_weights_and_keep_their_dtype_when_asked_for(model_file):
    path, _ = model_file
    vb = cn.VarBuilder.from_safetensors(path, dtype="float16")
    with pytest.raises(cn.DTypeError, match=f"tensor 'head.ids' in {path} is int64, not floating"):
        vb.get((5,), "head.ids")
    ids = vb.get((5,), "head.ids", integer=True)
    assert ids.dtype == mx.int64
    assert vb.get((2, 4), "head.weight").dtype == mx.float16


# -- dtypes --------------------------------------------------------------------------------------
@pytest.mark.parametrize("stored", [mx.float16, mx.bfloat16, mx.float32], ids=str)
@pytest.mark.parametrize("wanted", [mx.float32, mx.float16, "float32", "bf16"], ids=str)
def test_dtype_cast(tmp_path, stored, wanted):
    r = np.random.default_rng(1)
    ref32 = mx.array(r.standard_normal((6, 5)).astype(np.float32) * 100)
    stored_arr = ref32.astype(stored)
    path = tmp_path / "w.safetensors"
    mx.save_safetensors(str(path), {"w": stored_arr})
    vb = cn.VarBuilder.from_safetensors(path, dtype=wanted)
    want_dtype = {"float32": mx.float32, "bf16": mx.bfloat16}.get(wanted, wanted)
    assert vb.dtype == want_dtype
    got = vb.get((6, 5), "w")
    assert got.dtype == want_dtype
    # the cast is exactly MLX's own (round to nearest even), and widening is exact
    np.testing.assert_array_equal(bits(got), bits(stored_arr.astype(want_dtype)))
    if want_dtype == mx.float32:
        np.testing.assert_array_equal(np.array(got), np.array(stored_arr.astype(mx.float32)))


def test_with_dtype_keeps_prefix_and_access_log(model_file):
    path, _ = model_file
    vb = cn.VarBuilder.from_safetensors(path).pp("head")
    half = vb.with_dtype(mx.float16)
    assert half.prefix == "head" and half.dtype == mx.float16
    assert half.get((2, 4), "weight").dtype == mx.float16
    assert vb.accessed() == {"head.weight"}


def test_several_files_at_once(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"backbone.w": np.ones((2, 2), np.float32)}, str(a), metadata={"from": "a"})
    save_file({"head.w": np.full((3,), 2, np.float16)}, str(b), metadata={"other": "b"})
    vb = cn.VarBuilder.from_safetensors([a, str(b)])
    assert sorted(vb.names()) == ["backbone.w", "head.w"]
    assert float(vb.get((2, 2), "backbone.w").sum()) == 4.0
    head = vb.get((3,), "head.w")
    assert head.dtype == mx.float32 and float(head.sum()) == 6.0
    assert vb.metadata == {"from": "a", "other": "b"}
    with pytest.raises(cn.MissingTensorError) as info:
        vb.get((1,), "neck.w")
    assert str(a) in str(info.value) and str(b) in str(info.value)


def test_from_tensors_with_numpy_and_mlx_arrays():
    r = np.random.default_rng(2)
    w64 = r.standard_normal((3, 4))  # float64 NumPy: cast to the VarBuilder dtype
    tensors = {"lin.weight": w64, "lin.bias": mx.array(np.ones(3, np.float32)),
               "idx": np.arange(4, dtype=np.int32)}
    vb = cn.VarBuilder.from_tensors(tensors, dtype=mx.float32, device=cn.Device.cpu())
    w = vb.pp("lin").get((3, 4), "weight")
    assert w.dtype == mx.float32
    np.testing.assert_array_equal(np.array(w), w64.astype(np.float32))
    assert vb.pp("lin").get((3,), "bias").dtype == mx.float32
    assert vb.get((4,), "idx", integer=True).dtype == mx.int32
    assert vb.shape("lin.weight") == (3, 4) and vb.contains("idx")
    assert vb.from_tensors(tensors, dtype="f16").get(None, "lin.weight").dtype == mx.float16
    layer = cn.Linear.load(vb.pp("lin"), 4, 3)
    np.testing.assert_allclose(np.array(layer(mx.array(np.eye(4, dtype=np.float32)))),
                               w64.T.astype(np.float32) + 1, rtol=1e-6)


# -- error paths ---------------------------------------------------------------------------------
def test_missing_tensor_names_full_path_file_and_closest_names(model_file):
    path, _ = model_file
    vb = cn.VarBuilder.from_safetensors(path).pp("encoder").pp("layer1").pp(0)
    with pytest.raises(cn.MissingTensorError) as info:
        vb.get((4, 3, 3, 3), "conv2.weight")
    msg = str(info.value)
    assert "'encoder.layer1.0.conv2.weight'" in msg
    assert str(path) in msg
    assert "Closest names:" in msg and "encoder.layer1.0.conv1.weight" in msg
    assert isinstance(info.value, cn.CandleNNError) and isinstance(info.value, KeyError)
    assert not msg.startswith('"')  # not KeyError's quoted repr
    with pytest.raises(cn.MissingTensorError, match="encoder.layer1.0.nope"):
        vb.shape("nope")
    assert vb.accessed() == set()


def test_missing_tensor_without_close_names_says_none(model_file):
    path, _ = model_file
    with pytest.raises(cn.MissingTensorError) as info:
        cn.VarBuilder.from_safetensors(path).get(None, "zzzzzzzzzzzzzz")
    assert "Closest names" not in str(info.value) and "'zzzzzzzzzzzzzz'" in str(info.value)


def test_missing_tensor_in_dict_source():
    vb = cn.VarBuilder.from_tensors({"a.weight": np.zeros(2, np.float32)})
    with pytest.raises(cn.MissingTensorError, match=r"'a\.wieght'.*in-memory.*a\.weight"):
        vb.get((2,), "a.wieght")


def test_shape_mismatch_names_path_expected_and_found(model_file):
    path, _ = model_file
    vb = cn.VarBuilder.from_safetensors(path).pp("head")
    with pytest.raises(cn.ShapeMismatchError) as info:
        vb.get((3, 4), "weight")
    msg = str(info.value)
    assert "'head.weight'" in msg and "(2, 4)" in msg and "(3, 4)" in msg
    assert msg.index("(2, 4)") < msg.index("(3, 4)")  # "has shape FOUND, the model expects WANT"
    assert "expects (3, 4)" in msg
    assert isinstance(info.value, cn.CandleNNError) and isinstance(info.value, ValueError)
    assert vb.accessed() == set()  # a rejected tensor is not counted as used


def test_layer_load_reports_the_mismatching_tensor(model_file):
    path, _ = model_file
    vb = cn.VarBuilder.from_safetensors(path)
    with pytest.raises(cn.ShapeMismatchError, match=r"encoder\.layer1\.0\.conv1\.weight"):
        cn.Conv2d.load(vb.pp("encoder.layer1.0.conv1"), 3, 8, 3)


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(cn.WeightsFileError, match=r"weights file not found: .*nope\.safetensors"):
        cn.VarBuilder.from_safetensors(missing)
    with pytest.raises(cn.WeightsFileError, match="not found"):
        cn.VarMap().load(missing)


def test_directory(tmp_path):
    with pytest.raises(cn.WeightsFileError, match="is a directory"):
        cn.VarBuilder.from_safetensors(tmp_path)


def test_no_files():
    with pytest.raises(cn.WeightsFileError, match="at least one file"):
        cn.VarBuilder.from_safetensors([])


@pytest.mark.parametrize("dtype", ["float64", "int8", "fp32x", mx.int32, mx.float64], ids=str)
def test_unknown_or_unsupported_dtype(model_file, dtype):
    path, _ = model_file
    with pytest.raises(cn.DTypeError) as info:
        cn.VarBuilder.from_safetensors(path, dtype=dtype)
    assert "float32" in str(info.value) and "bfloat16" in str(info.value)
    assert isinstance(info.value, cn.CandleNNError)
    with pytest.raises(cn.DTypeError):
        cn.VarBuilder.from_tensors({}, dtype=dtype)


def test_errors_share_the_candle_nn_base():
    for err in (cn.MissingTensorError, cn.ShapeMismatchError, cn.WeightsFileError, cn.DTypeError,
                cn.DeviceMismatchError, cn.DeviceUnavailableError, cn.ImageError):
        assert issubclass(err, cn.CandleNNError)


# -- VarMap --------------------------------------------------------------------------------------
class Tiny(cn.Module):
    def __init__(self, conv: cn.Conv2d, bn: cn.BatchNorm2d, ln: cn.LayerNorm,
                 fc: cn.Linear) -> None:
        super().__init__(conv.device)
        self.conv, self.bn, self.ln, self.fc = conv, bn, ln, fc

    @classmethod
    def load(cls, vb: cn.VarBuilder) -> "Tiny":
        return cls(cn.Conv2d.load(vb.pp("conv"), 3, 4, 3, cn.Conv2dConfig(padding=1)),
                   cn.BatchNorm2d.load(vb.pp("bn"), 4), cn.LayerNorm.load(vb.pp("ln"), 4),
                   cn.Linear.load(vb.pp("fc"), 4, 2))

    def forward(self, x: mx.array) -> mx.array:
        return self.fc(self.ln(cn.relu(self.bn(self.conv(x)))).mean(axis=(1, 2)))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
def test_varmap_save_then_from_safetensors_is_bit_exact(tmp_path, dtype):
    varmap = cn.VarMap()
    Tiny.load(cn.VarBuilder.from_varmap(varmap, dtype=dtype, seed=7))
    assert len(varmap) == 10 and "conv.weight" in varmap
    assert varmap["conv.weight"].shape == (4, 3, 3, 3)  # stored in candle layout
    path = tmp_path / "tiny.safetensors"
    varmap.save(path, metadata={"note": "seed 7"})
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.safetensors"]  # no temp file left
    vb = cn.VarBuilder.from_safetensors(path, dtype=dtype, device="cpu")
    assert sorted(vb.names()) == sorted(varmap)
    assert vb.metadata == {"note": "seed 7", "format": "pt", "candle_nn.layout": "candle"}
    for name, value in varmap.all_vars().items():
        got = vb.get(value.shape, name)
        assert got.dtype == value.dtype == dtype
        np.testing.assert_array_equal(bits(got), bits(value), err_msg=name)
    # and the reloaded model computes the same thing
    x = mx.array(np.random.default_rng(3).standard_normal((1, 5, 5, 3)).astype(np.float32))
    x = x.astype(dtype)
    a = Tiny.load(cn.VarBuilder.from_varmap(varmap, dtype=dtype, seed=7, device="cpu"))(x)
    b = Tiny.load(vb)(x)
    np.testing.assert_array_equal(bits(a), bits(b))


def test_varmap_load_replaces_values_and_checks_shapes(tmp_path):
    src = cn.VarMap()
    Tiny.load(cn.VarBuilder.from_varmap(src, seed=1))
    path = tmp_path / "a.safetensors"
    src.save(path)

    dst = cn.VarMap()
    Tiny.load(cn.VarBuilder.from_varmap(dst, seed=2))
    assert not np.array_equal(np.array(dst["fc.weight"]), np.array(src["fc.weight"]))
    dst.load(path)
    for name in src:
        np.testing.assert_array_equal(np.array(dst[name]), np.array(src[name]))
    # a VarMap-backed builder now returns the loaded values instead of creating new ones
    vb = cn.VarBuilder.from_varmap(dst, seed=2)
    np.testing.assert_array_equal(np.array(vb.get((2, 4), "fc.weight")), np.array(src["fc.weight"]))

    bad = cn.VarMap()
    bad.set("fc.weight", mx.zeros((3, 3)))
    with pytest.raises(cn.ShapeMismatchError, match=r"'fc\.weight'.*\(2, 4\).*\(3, 3\)"):
        bad.load(path)


def test_varmap_errors():
    varmap = cn.VarMap()
    vb = cn.VarBuilder.from_varmap(varmap, seed=0)
    vb.get((2, 3), "w")
    with pytest.raises(cn.ShapeMismatchError, match=r"'w'.*\(2, 3\).*\(3, 2\)"):
        vb.get((3, 2), "w")
    with pytest.raises(cn.MissingTensorError, match="no shape was given"):
        vb.get(None, "new")
    assert vb.get(None, "w").shape == (2, 3)
    assert vb.contains("w") and not vb.contains("new") and vb.shape("w") == (2, 3)
    with pytest.raises(cn.MissingTensorError, match="VarMap"):
        vb.shape("new")


def test_varmap_save_to_unwritable_place(tmp_path):
    varmap = cn.VarMap()
    varmap.set("w", mx.ones((2,)))
    with pytest.raises(cn.WeightsFileError, match="cannot write"):
        varmap.save(tmp_path / "no" / "such" / "dir" / "w.safetensors")


def test_varmap_load_bfloat16_file(tmp_path):
    value = mx.array(np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)).astype(mx.bfloat16)
    path = tmp_path / "bf16.safetensors"
    mx.save_safetensors(str(path), {"w": value})
    varmap = cn.VarMap()
    varmap.load(path)
    assert varmap["w"].dtype == mx.bfloat16
    np.testing.assert_array_equal(bits(varmap["w"]), bits(value))


# -- float64 sources -----------------------------------------------------------------------------
# MLX has float64 on the CPU only; a float64 tensor (NumPy's default dtype, an F64 file) must be
# narrowed on the CPU stream even when the VarBuilder's device is a GPU.
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16], ids=str)
def test_float64_numpy_tensors_load_on_every_device(device, dtype):
    r = np.random.default_rng(0)
    w, b = r.standard_normal((6, 5)), r.standard_normal(6)  # float64, as NumPy makes them
    x = r.standard_normal((3, 5)).astype(np.float32)
    vb = cn.VarBuilder.from_tensors({"fc.weight": w, "fc.bias": b}, device=device, dtype=dtype)
    fc = cn.Linear.load(vb.pp("fc"), 5, 6)
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
    path = tmp_path / "bf16.safetensors"
    tensors = {f"blocks.{i}.weight": mx.random.normal((3, 2), key=mx.random.key(i)).astype(
        mx.bfloat16) for i in range(50)}
    mx.save_safetensors(str(path), tensors)
    safetensors_io._header.cache_clear()
    vb = cn.VarBuilder.from_safetensors(path, dtype="bf16", device="cpu")
    for name, value in tensors.items():
        got = vb.get((3, 2), name)
        assert got.dtype == mx.bfloat16 and mx.array_equal(got, value).item(), name
    assert safetensors_io._header.cache_info().misses == 1
    # a rewritten file is parsed again, not served from the stale cache
    tensors = {"blocks.0.weight": mx.ones((3, 2), mx.bfloat16), "x": mx.zeros((4,), mx.bfloat16)}
    mx.save_safetensors(str(path), tensors)
    vb = cn.VarBuilder.from_safetensors(path, dtype="bf16", device="cpu")
    assert mx.array_equal(vb.get((3, 2), "blocks.0.weight"), tensors["blocks.0.weight"]).item()


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
