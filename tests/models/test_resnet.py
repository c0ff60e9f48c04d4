"""ResNet: parity with torchvision's resnet18 (fixture), the other depths' structure, and a
NumPy reference of the bottleneck path."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_matches, nchw_to_nhwc

import candle_nn as cn
from candle_nn_models.imagenet import class_names, preprocess, preprocess_batch
from candle_nn_models.resnet import VARIANTS, ResidualBlock, ResNet, infer_variant

# torchvision 0.29.1's parameter counts (its weights' "num_params": numel over
# model.parameters(), 1000 classes; BatchNorm running stats are buffers, not parameters).
TORCHVISION_PARAMS = {"resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032,
                      "resnet101": 44_549_160, "resnet152": 60_192_808}


@pytest.fixture(scope="module")
def fixture(resnet18_fixture):
    return resnet18_fixture


@pytest.fixture(scope="module", params=cn.Device.available(), ids=str)
def outputs(request, fixture):
    io, _, folder = fixture
    vb = cn.VarBuilder.from_safetensors(folder / "weights.safetensors", device=request.param)
    model = ResNet.load(vb, "resnet18", 1000)
    assert model.device == request.param
    assert vb.accessed() == set(vb.names())  # every tensor of the file is used
    x = mx.array(nchw_to_nhwc(io["input.image"]))
    feats = model.forward_features(x)
    feats["logits"] = model(x)
    assert all(v.dtype == mx.float32 for v in feats.values())
    return {k: np.array(v) for k, v in feats.items()}


@pytest.mark.parametrize("key", ["stem", "layer1", "layer2", "layer3", "layer4", "logits"])
def test_resnet18_matches_torchvision(outputs, fixture, key):
    io, meta, _ = fixture
    ref = io[f"output.{key}"]
    got = outputs[key] if key == "logits" else outputs[key].transpose(0, 3, 1, 2)
    assert_matches(meta, key, got, ref)


def test_preprocessing_reproduces_the_fixture_input(fixture):
    io, _, _ = fixture
    ours = preprocess(io["input.raw_rgb"])
    ref = io["input.image"][0].transpose(1, 2, 0)
    assert ours.shape == (224, 224, 3) and ours.dtype == np.float32
    # PIL's and torchvision's antialiased bilinear filters round differently: at most one uint8
    # level apart, 6.6e-3 of max|ref| measured.
    assert np.abs(ours - ref).max() / np.abs(ref).max() < 1e-2
    assert np.abs(ours - ref).mean() < 1e-3
    assert preprocess_batch([io["input.raw_rgb"]] * 2).shape == (2, 224, 224, 3)


def test_preprocessing_rejects_non_rgb():
    with pytest.raises(ValueError, match="uint8"):
        preprocess(np.zeros((10, 10), np.uint8))


def test_class_names_ship_with_the_package():
    names = class_names()
    assert len(names) == 1000 and names[0] == "tench" and names[444] == "bicycle-built-for-two"


def _torchvision_layout(variant: str, num_classes: int = 1000) -> dict[str, tuple[int, ...]]:
    """Every tensor name and shape of torchvision's resnet, from its construction rules."""
    config = VARIANTS[variant]
    out: dict[str, tuple[int, ...]] = {}

    def conv_bn(conv: str, bn: str, cin: int, cout: int, k: int) -> None:
        out[f"{conv}.weight"] = (cout, cin, k, k)
        for name in ("weight", "bias", "running_mean", "running_var"):
            out[f"{bn}.{name}"] = (cout,)

    conv_bn("conv1", "bn1", 3, 64, 7)
    cin = 64
    for stage, (width, count) in enumerate(zip((64, 128, 256, 512), config.blocks), 1):
        cout = width * config.expansion
        for i in range(count):
            p = f"layer{stage}.{i}"
            if config.bottleneck:
                conv_bn(f"{p}.conv1", f"{p}.bn1", cin, width, 1)
                conv_bn(f"{p}.conv2", f"{p}.bn2", width, width, 3)
                conv_bn(f"{p}.conv3", f"{p}.bn3", width, cout, 1)
            else:
                conv_bn(f"{p}.conv1", f"{p}.bn1", cin, width, 3)
                conv_bn(f"{p}.conv2", f"{p}.bn2", width, width, 3)
            if i == 0 and (stage > 1 or cin != cout):
                conv_bn(f"{p}.downsample.0", f"{p}.downsample.1", cin, cout, 1)
            cin = cout
    out["fc.weight"], out["fc.bias"] = (num_classes, cin), (num_classes,)
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_torchvision_layout_has_torchvision_parameter_counts(variant):
    tensors = _torchvision_layout(variant)
    params = sum(math.prod(s) for n, s in tensors.items() if "running_" not in n)
    assert params == TORCHVISION_PARAMS[variant]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_depth_reads_torchvision_names_runs_and_is_recognised(variant):
    varmap = cn.VarMap()
    vb = cn.VarBuilder.from_varmap(varmap, seed=1, device="cpu")
    model = ResNet.load(vb, variant, num_classes=7)
    # The VarMap holds what the model asked for, in the checkpoint (PyTorch) layout.
    shapes = {name: tuple(a.shape) for name, a in varmap.all_vars().items()}
    assert shapes == _torchvision_layout(variant, num_classes=7)
    logits = model(mx.random.normal((2, 64, 64, 3), key=mx.random.key(0)))
    assert logits.shape == (2, 7) and bool(mx.all(mx.isfinite(logits)))
    assert infer_variant(cn.VarBuilder.from_tensors(varmap.all_vars())) == (variant, 7)


def test_a_builder_that_loaded_a_deeper_variant_refuses_a_shallower_one():
    """The tensors a load reads are counted per load: after ``resnet34`` read every tensor of
    the file, ``resnet18`` (and ``build_model``) from the same builder still leave layer3.2 and
    others unread, which refuses the file as a truncated model would be."""
    from candle_nn_models.weights.spec import build_model

    varmap = cn.VarMap()
    ResNet.load(cn.VarBuilder.from_varmap(varmap, seed=0), "resnet34", num_classes=3)
    vb = cn.VarBuilder.from_tensors(varmap.all_vars(), device="cpu")
    ResNet.load(vb, "resnet34", num_classes=3)
    with pytest.raises(cn.ShapeMismatchError, match="resnet18 does not read .*layer1.2"):
        ResNet.load(vb, "resnet18", num_classes=3)
    with pytest.raises(cn.ShapeMismatchError, match="resnet18 does not read"):
        build_model("resnet", "resnet18", vb, num_classes=3)
    assert ResNet.load(vb, "resnet34", num_classes=3).num_classes == 3  # still loads


def test_models_built_one_after_another_from_one_varmap_load():
    """A VarMap holds the variables of every model built from it (the README builds ResNet,
    YOLOv8 and SAM from one ``vb``): after a second load of the same model started a new load,
    the first's variables are not taken for a wrong variant's."""
    from candle_nn_models.yolo_v8 import YoloV8

    vb = cn.VarBuilder.from_varmap(cn.VarMap(), seed=0, device="cpu")
    ResNet.load(vb, "resnet18", num_classes=3)
    YoloV8.load(vb, "n", num_classes=2)
    YoloV8.load(vb, "n", num_classes=2)  # re-reads: a new load
    assert ResNet.load(vb, "resnet18", num_classes=3).num_classes == 3


def test_headless_model_returns_pooled_features():
    vb = cn.VarBuilder.from_varmap(cn.VarMap(), seed=2, device="cpu")
    model = ResNet.load(vb, "resnet50", num_classes=None)
    assert model.num_classes is None
    assert model(mx.zeros((1, 64, 64, 3))).shape == (1, 2048)
    assert not any(name.startswith("fc.") for name in vb.accessed())


def test_infer_variant_rejects_other_models(fixture):
    vb = cn.VarBuilder.from_tensors({"net.b1.0.conv.weight": np.zeros((16, 3, 3, 3), np.float32)})
    with pytest.raises(cn.WeightsFileError, match="holds no ResNet"):
        infer_variant(vb)


def test_infer_variant_names_the_file_for_unknown_depths():
    varmap = cn.VarMap()
    ResNet.load(cn.VarBuilder.from_varmap(varmap, seed=0), "resnet18", num_classes=3)
    tensors = {k: v for k, v in varmap.all_vars().items() if not k.startswith("layer3.1.")}
    with pytest.raises(cn.WeightsFileError, match=r"^odd\.safetensors holds a ResNet with basic "
                       r"blocks \(2, 2, 1, 2\) per stage, which is none of resnet18"):
        infer_variant(cn.VarBuilder.from_tensors(tensors), name="odd.safetensors")


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="resnet18"):
        ResNet.load(cn.VarBuilder.from_varmap(cn.VarMap()), "resnet19")


def _np_conv(x, w, stride=1, pad=0):
    """NHWC x, OIHW w, float64, zero padding."""
    x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    o, i, kh, kw = w.shape
    n, h, wd, _ = x.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, oh, ow, o))
    for a in range(kh):
        for b in range(kw):
            patch = x[:, a:a + stride * oh:stride, b:b + stride * ow:stride, :]
            out += patch @ w[:, :, a, b].T
    return out


def _np_bn(x, p, eps=1e-5):
    return (x - p["running_mean"]) / np.sqrt(p["running_var"] + eps) * p["weight"] + p["bias"]


def test_bottleneck_with_downsample_matches_numpy():
    rng = np.random.default_rng(50)
    cin, width, stride = 32, 16, 2
    cout = width * 4
    tensors: dict[str, np.ndarray] = {}

    def conv_bn(conv, bn, ci, co, k):
        tensors[f"{conv}.weight"] = rng.normal(0, 1 / math.sqrt(ci * k * k), (co, ci, k, k))
        tensors[f"{bn}.weight"] = rng.uniform(0.5, 1.5, co)
        tensors[f"{bn}.bias"] = rng.normal(0, 0.1, co)
        tensors[f"{bn}.running_mean"] = rng.normal(0, 0.1, co)
        tensors[f"{bn}.running_var"] = rng.uniform(0.5, 2.0, co)

    conv_bn("conv1", "bn1", cin, width, 1)
    conv_bn("conv2", "bn2", width, width, 3)
    conv_bn("conv3", "bn3", width, cout, 1)
    conv_bn("downsample.0", "downsample.1", cin, cout, 1)
    tensors = {k: v.astype(np.float32) for k, v in tensors.items()}
    vb = cn.VarBuilder.from_tensors(tensors, device="cpu")
    block = ResidualBlock.load(vb, VARIANTS["resnet50"], cin, width, stride)
    x = rng.normal(size=(2, 9, 11, cin)).astype(np.float32)
    got = np.array(block(mx.array(x)))

    t = {k: v.astype(np.float64) for k, v in tensors.items()}

    def bn(name):
        return {k.split(".")[-1]: v for k, v in t.items() if k.startswith(name + ".")}

    def relu(a):
        return np.maximum(a, 0)

    y = relu(_np_bn(_np_conv(x, t["conv1.weight"]), bn("bn1")))
    y = relu(_np_bn(_np_conv(y, t["conv2.weight"], stride, 1), bn("bn2")))
    y = _np_bn(_np_conv(y, t["conv3.weight"]), bn("bn3"))
    short = _np_bn(_np_conv(x, t["downsample.0.weight"], stride), bn("downsample.1"))
    ref = relu(y + short)
    assert got.shape == ref.shape == (2, 5, 6, cout)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5
