"""Op x device matrix: every candle_nn layer's forward on every available device, against a
float64 NumPy reference written here.

Weights are handed over in candle/PyTorch layout through ``VarBuilder.from_tensors`` (conv
``(O, I/groups, kH, kW)``, transposed conv ``(I, O, kH, kW)``, linear ``(out, in)``), so the layout
conversion done at load is part of what is tested. Images are NHWC.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as mlx_nn
import numpy as np
import pytest
from conftest import rel_err
from helpers.activation_reference import ACTIVATIONS

import candle_nn as cn
from candle_nn.pairs import pair

TOL = 1e-5  # max|err| / max|ref|, float32 vs float64


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def randn(r: np.random.Generator, *shape: int) -> np.ndarray:
    return r.standard_normal(shape).astype(np.float32)


def close(got, ref, tol: float = TOL) -> None:
    got = np.array(got)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert np.isfinite(got).all()
    err = rel_err(got, ref)
    assert err <= tol, f"rel err {err:.3e} > {tol:.0e}"


def on(device: cn.Device, fn, *args, **kwargs):
    """Run a stateless op on ``device``'s stream and evaluate it there."""
    with mx.stream(device.stream):
        out = fn(*args, **kwargs)
        mx.eval(out)
    return out


def vb_of(tensors: dict[str, np.ndarray], device: cn.Device) -> cn.VarBuilder:
    return cn.VarBuilder.from_tensors(tensors, device=device)


def f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


# -- NumPy references (NHWC, float64) ------------------------------------------------------------
def ref_conv2d(x, w_oihw, b, padding=0, stride=1, dilation=1, groups=1):
    """Direct convolution: one matmul per kernel tap and group."""
    x, w = f64(x), f64(w_oihw)
    (ph, pw), (sh, sw), (dh, dw) = pair(padding), pair(stride), pair(dilation)
    n, h, wd, cin = x.shape
    cout, cig, kh, kw = w.shape
    xp = np.pad(x, [(0, 0), (ph, ph), (pw, pw), (0, 0)])
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cog = cout // groups
    out = np.zeros((n, oh, ow, cout))
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, i * dh: i * dh + sh * (oh - 1) + 1: sh,
                           j * dw: j * dw + sw * (ow - 1) + 1: sw, g * cig:(g + 1) * cig]
                out[..., g * cog:(g + 1) * cog] += patch @ w[g * cog:(g + 1) * cog, :, i, j].T
    return out if b is None else out + f64(b)


def ref_conv_transpose2d(x, w_iohw, b, padding=0, output_padding=0, stride=1, dilation=1):
    """Scatter-add definition: input pixel (h, w) adds ``x[h, w] @ W[:, :, i, j]`` at
    ``(h * s + i * d - p, w * s + j * d - p)``."""
    x, w = f64(x), f64(w_iohw)
    (ph, pw), (oph, opw) = pair(padding), pair(output_padding)
    (sh, sw), (dh, dw) = pair(stride), pair(dilation)
    n, h, wd, _ = x.shape
    _, cout, kh, kw = w.shape
    oh = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    ow = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    # Canvas large enough for every scatter target before cropping by the padding.
    canvas = np.zeros((n, oh + 2 * ph + sh * h + dh * kh, ow + 2 * pw + sw * wd + dw * kw, cout))
    for ih in range(h):
        for iw in range(wd):
            for i in range(kh):
                for j in range(kw):
                    oy, ox = ih * sh + i * dh, iw * sw + j * dw
                    canvas[:, oy, ox, :] += x[:, ih, iw, :] @ w[:, :, i, j]
    out = canvas[:, ph:ph + oh, pw:pw + ow, :]
    return out if b is None else out + f64(b)


def ref_pool(x, k, s, p, mode):
    x = f64(x)
    (kh, kw), (sh, sw), (ph, pw) = pair(k), pair(s), pair(p)
    fill = -np.inf if mode == "max" else 0.0
    xp = np.pad(x, [(0, 0), (ph, ph), (pw, pw), (0, 0)], constant_values=fill)
    n, h, w, c = xp.shape
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    out = np.empty((n, oh, ow, c))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, i * sh:i * sh + kh, j * sw:j * sw + kw, :]
            out[:, i, j] = win.max(axis=(1, 2)) if mode == "max" else win.mean(axis=(1, 2))
    return out


def ref_layer_norm(x, w, b, eps, remove_mean=True):
    x = f64(x)
    if remove_mean:
        x = x - x.mean(-1, keepdims=True)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    if w is not None:
        y = y * f64(w)
    if b is not None:
        y = y + f64(b)
    return y


def ref_softmax(x, axis=-1):
    x = f64(x)
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


# -- Linear --------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_linear(device, bias):
    r = rng(1)
    w, b, x = randn(r, 24, 40), randn(r, 24), randn(r, 3, 5, 40)
    tensors = {"fc.weight": w, "fc.bias": b} if bias else {"fc.weight": w}
    layer = cn.Linear.load(vb_of(tensors, device).pp("fc"), 40, 24, bias=bias)
    assert layer.device == device and ("bias" in layer) == bias
    ref = f64(x) @ f64(w).T + (f64(b) if bias else 0.0)
    close(layer(mx.array(x)), ref)


def test_linear_without_bias_ignores_a_stored_bias(device):
    r = rng(2)
    tensors = {"weight": randn(r, 4, 6), "bias": randn(r, 4)}
    layer = cn.Linear.load(vb_of(tensors, device), 6, 4, bias=False)
    x = randn(r, 2, 6)
    close(layer(mx.array(x)), f64(x) @ f64(tensors["weight"]).T)


# -- Conv2d --------------------------------------------------------------------------------------
CONV_CASES = {
    # id: (in, out, kernel, config kwargs, input HxW)
    "3x3_pad1": (4, 6, 3, dict(padding=1), (9, 9)),
    "1x1": (5, 7, 1, dict(), (6, 6)),  # the matmul path
    "1x1_s2": (5, 7, 1, dict(stride=2), (7, 7)),  # strided pointwise: MLX's conv
    "1x1_pad1": (5, 7, 1, dict(padding=1), (4, 5)),
    "7x7_s2_p3": (3, 8, 7, dict(padding=3, stride=2), (17, 17)),
    "stride2_nopad": (4, 4, 3, dict(stride=2), (10, 10)),
    "dilation2": (4, 5, 3, dict(padding=2, dilation=2), (11, 11)),
    "groups2": (6, 4, 3, dict(padding=1, groups=2), (8, 8)),
    "depthwise": (6, 6, 3, dict(padding=1, groups=6), (8, 8)),
    "depthwise_s2_rect": (6, 6, (3, 5), dict(padding=(1, 2), stride=2, groups=6), (9, 11)),
    "depthwise_dilated": (6, 6, 3, dict(padding=2, dilation=2, groups=6), (9, 9)),
    "depthwise_mult2_s2": (4, 8, 3, dict(padding=1, stride=2, groups=4), (9, 9)),
    "rect_kernel": (3, 5, (1, 3), dict(padding=(0, 1)), (7, 6)),
    "rect_input_mixed": (4, 6, (3, 5), dict(padding=(1, 2), stride=(2, 1), dilation=(1, 2)),
                         (13, 9)),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv2d(device, case, bias):
    cin, cout, k, cfg, (h, w) = CONV_CASES[case]
    kh, kw = pair(k)
    groups = cfg.get("groups", 1)
    r = rng(sum(map(ord, case)))
    weight, b = randn(r, cout, cin // groups, kh, kw), randn(r, cout)
    x = randn(r, 2, h, w, cin)
    tensors = {"weight": weight, "bias": b} if bias else {"weight": weight}
    config = cn.Conv2dConfig(**cfg)
    conv = cn.Conv2d.load(vb_of(tensors, device), cin, cout, k, config, bias=bias)
    assert conv.weight.shape == (cout, kh, kw, cin // groups)  # MLX layout
    close(conv(mx.array(x)), ref_conv2d(x, weight, b if bias else None, **cfg))


def test_conv2d_helpers_and_group_check(device):
    r = rng(3)
    vb = vb_of({"c.weight": randn(r, 4, 2, 3, 3), "c.bias": randn(r, 4)}, device)
    assert "bias" in cn.Conv2d.load(vb.pp("c"), 2, 4, 3, cn.Conv2dConfig())
    assert "bias" not in cn.Conv2d.load(vb.pp("c"), 2, 4, 3, cn.Conv2dConfig(), bias=False)
    with pytest.raises(cn.ShapeMismatchError, match="groups=3"):
        cn.Conv2d.load(vb.pp("c"), 2, 4, 3, cn.Conv2dConfig(groups=3))


# -- ConvTranspose2d -----------------------------------------------------------------------------
CONVT_CASES = {
    # id: (kernel, stride, padding, output_padding, dilation)
    "k2_s2": (2, 2, 0, 0, 1),
    "k3_s1": (3, 1, 0, 0, 1),
    "k3_s2_p1": (3, 2, 1, 0, 1),
    "k3_s2_p1_op1": (3, 2, 1, 1, 1),
    "k4_s2_p1": (4, 2, 1, 0, 1),
    "k4_s2_p0_op1": (4, 2, 0, 1, 1),
    "k3_s2_p2_op1": (3, 2, 2, 1, 1),
    "k3_s1_p1_d2": (3, 1, 1, 0, 2),
    "k2_s2_p1_op1": (2, 2, 1, 1, 1),  # the block (matmul) path, cropped
    "k1_s2_p1": (1, 2, 1, 0, 1),  # kernel < stride: MLX's own conv_transpose2d sizes this wrongly
    "k3_s3_p1_d2": (3, 3, 1, 0, 2),
    "rect": ((2, 3), (2, 1), (0, 1), (1, 0), 1),
}


@pytest.mark.parametrize("case", list(CONVT_CASES))
def test_conv_transpose2d(device, case):
    k, s, p, op, d = CONVT_CASES[case]
    kh, kw = pair(k)
    cin, cout = 5, 3
    r = rng(sum(map(ord, case)))
    weight, b = randn(r, cin, cout, kh, kw), randn(r, cout)  # PyTorch (I, O, kH, kW)
    x = randn(r, 2, 5, 4, cin)
    config = cn.ConvTranspose2dConfig(padding=p, output_padding=op, stride=s, dilation=d)
    layer = cn.ConvTranspose2d.load(vb_of({"weight": weight, "bias": b}, device), cin, cout, k,
                                    config)
    assert layer.weight.shape == (cout, kh, kw, cin)
    ref = ref_conv_transpose2d(x, weight, b, p, op, s, d)
    close(layer(mx.array(x)), ref)


def test_conv_transpose2d_helper_without_stored_bias_fails(device):
    r = rng(4)
    vb = vb_of({"weight": randn(r, 2, 3, 2, 2)}, device)
    with pytest.raises(cn.MissingTensorError, match="bias"):
        cn.ConvTranspose2d.load(vb, 2, 3, 2, cn.ConvTranspose2dConfig(stride=2))
    layer = cn.ConvTranspose2d.load(vb, 2, 3, 2, cn.ConvTranspose2dConfig(stride=2), bias=False)
    x = randn(r, 1, 3, 3, 2)
    close(layer(mx.array(x)), ref_conv_transpose2d(x, vb.get(None, "weight"), None, stride=2))


# -- pooling -------------------------------------------------------------------------------------
POOL_CASES = {
    "k2": (2, None, 0),
    "k3_s2_p1": (3, 2, 1),
    "k3_s1_p1": (3, 1, 1),
    "k2_s1": (2, 1, 0),
    "rect": ((2, 3), (1, 2), (1, 1)),
}


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("case", list(POOL_CASES))
def test_pooling(device, case, mode):
    k, s, p = POOL_CASES[case]
    x = randn(rng(5), 2, 9, 8, 3)
    cls = cn.MaxPool2d if mode == "max" else cn.AvgPool2d
    fn = cn.max_pool2d if mode == "max" else cn.avg_pool2d
    ref = ref_pool(x, k, s if s is not None else k, p, mode)
    close(on(device, cls(k, s, p, device=device), mx.array(x)), ref)
    close(on(device, fn, mx.array(x), k, s, p), ref)


def test_max_pool_with_negative_inputs_ignores_padding(device):
    x = -np.abs(randn(rng(6), 1, 5, 5, 2)) - 1.0  # all < 0: a zero pad would win the max
    close(on(device, cn.max_pool2d, mx.array(x), 3, 2, 1), ref_pool(x, 3, 2, 1, "max"))


def test_avg_pool_is_not_a_max_pool(device):
    avg, mxp = cn.AvgPool2d(2), cn.MaxPool2d(2)
    assert not isinstance(avg, cn.MaxPool2d) and not isinstance(mxp, cn.AvgPool2d)
    x = mx.array(np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1))
    with mx.stream(device.stream):
        assert np.array(avg(x)).ravel().tolist() == [2.5, 4.5, 10.5, 12.5]
        assert np.array(mxp(x)).ravel().tolist() == [5.0, 7.0, 13.0, 15.0]


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_pooling_is_mlxs_own_off_cuda(dtype):
    """Off a CUDA GPU (whose max pool is candle_nn's kernel) pooling is mlx.nn's, bit for bit."""
    x = mx.array(randn(rng(5), 2, 9, 8, 3)).astype(dtype)
    for k, s, p in POOL_CASES.values():
        assert mx.array_equal(cn.max_pool2d(x, k, s, p), mlx_nn.MaxPool2d(k, s, p)(x))
        assert mx.array_equal(cn.AvgPool2d(k, s, p)(x), mlx_nn.AvgPool2d(k, s, p)(x))


# -- normalisation -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["affine", "not_affine", "rms", "rms_not_affine", "eps_float"])
def test_layer_norm(device, kind):
    r = rng(7)
    d = 48
    w, b = randn(r, d), randn(r, d)
    x = randn(r, 2, 7, d) * 3 + 1.5
    eps = 1e-5
    tensors = {"ln.weight": w, "ln.bias": b}
    vb = vb_of(tensors, device).pp("ln")
    if kind == "affine":
        layer, ref = cn.LayerNorm.load(vb, d), ref_layer_norm(x, w, b, eps)
    elif kind == "not_affine":
        layer = cn.LayerNorm.load(vb, d, cn.LayerNormConfig(affine=False))
        ref = ref_layer_norm(x, None, None, eps)
    elif kind == "rms":
        layer = cn.LayerNorm.load(vb, d, cn.LayerNormConfig(eps=eps, remove_mean=False))
        ref = ref_layer_norm(x, w, None, eps, remove_mean=False)
        assert "bias" not in layer
    elif kind == "rms_not_affine":
        layer = cn.LayerNorm.load(vb, d, cn.LayerNormConfig(remove_mean=False, affine=False))
        ref = ref_layer_norm(x, None, None, eps, remove_mean=False)
    else:
        eps = 0.5  # large enough to matter
        layer, ref = cn.LayerNorm.load(vb, d, eps), ref_layer_norm(x, w, b, eps)
    close(layer(mx.array(x)), ref)


def test_layer_norm2d_normalises_channels_of_nhwc(device):
    r = rng(8)
    c = 16
    w, b, x = randn(r, c), randn(r, c), randn(r, 2, 5, 6, c)
    layer = cn.LayerNorm2d.load(vb_of({"weight": w, "bias": b}, device), c)
    assert layer.config.eps == 1e-6
    close(layer(mx.array(x)), ref_layer_norm(x, w, b, 1e-6))


def bn_tensors(r, c):
    return {"weight": randn(r, c), "bias": randn(r, c), "running_mean": randn(r, c),
            "running_var": (np.abs(randn(r, c)) + 0.1).astype(np.float32)}


def ref_bn(x, t, eps):
    return ((f64(x) - f64(t["running_mean"])) / np.sqrt(f64(t["running_var"]) + eps)
            * f64(t["weight"]) + f64(t["bias"]))


@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_batch_norm2d(device, eps):
    r = rng(9)
    t = bn_tensors(r, 6)
    x = randn(r, 2, 4, 5, 6)
    close(cn.BatchNorm2d.load(vb_of(t, device), 6, eps)(mx.array(x)), ref_bn(x, t, eps))


@pytest.mark.parametrize("conv_bias", [True, False], ids=["bias", "no_bias"])
def test_batch_norm_folds_into_conv(device, conv_bias):
    r = rng(10)
    t = {f"bn.{k}": v for k, v in bn_tensors(r, 8).items()}
    t["conv.weight"], t["conv.bias"] = randn(r, 8, 4, 3, 3), randn(r, 8)
    vb = vb_of(t, device)
    cfg = cn.Conv2dConfig(padding=1, stride=2)
    conv = cn.Conv2d.load(vb.pp("conv"), 4, 8, 3, cfg, bias=conv_bias)
    bn = cn.BatchNorm2d.load(vb.pp("bn"), 8)
    folded = conv.absorb_bn(bn)
    assert folded.device == device and "bias" in folded and folded.config == cfg
    x = randn(r, 2, 9, 9, 4)
    conv_ref = ref_conv2d(x, t["conv.weight"], t["conv.bias"] if conv_bias else None,
                          padding=1, stride=2)
    ref = ref_bn(conv_ref, {k[3:]: v for k, v in t.items() if k.startswith("bn.")}, 1e-5)
    close(folded(mx.array(x)), ref)
    close(bn(conv(mx.array(x))), ref)


@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_load_with_bn_reads_a_conv_and_its_batch_norm_as_one_conv(device, eps):
    """The shared conv + BatchNorm helper (ResNet, YOLOv8, TinyViT): a bias-free conv and the
    BatchNorm after it, under names of the caller's choice, absorbed into one Conv2d; saving it
    writes both layers' candle names again."""
    r = rng(11)
    t = {f"m.norm.{k}": v for k, v in bn_tensors(r, 6).items()}
    t["m.c.weight"] = randn(r, 6, 3, 3, 3)
    cfg = cn.Conv2dConfig(padding=1)
    layer = cn.Conv2d.load_with_bn(vb_of(t, device).pp("m"), 3, 6, 3, cfg, conv="c", bn="norm",
                                   eps=eps)
    assert layer.device == device and layer.config == cfg and "bias" in layer
    x = randn(r, 2, 7, 5, 3)
    ref = ref_bn(ref_conv2d(x, t["m.c.weight"], None, padding=1),
                 {k[7:]: v for k, v in t.items() if k.startswith("m.norm.")}, eps)
    close(layer(mx.array(x)), ref)
    assert set(cn.state_dict(layer)) == set(t)


def conv_on(device: cn.Device) -> cn.Conv2d:
    w = np.random.default_rng(2).standard_normal((4, 2, 3, 3)).astype(np.float32)
    return cn.Conv2d.load(cn.VarBuilder.from_tensors({"weight": w}, device=device), 2, 4, 3,
                          bias=False)


def bn_on(device: cn.Device, channels: int = 4) -> cn.BatchNorm2d:
    t = {"weight": np.ones(channels, np.float32), "bias": np.zeros(channels, np.float32),
         "running_mean": np.zeros(channels, np.float32),
         "running_var": np.ones(channels, np.float32)}
    return cn.BatchNorm2d.load(cn.VarBuilder.from_tensors(t, device=device), channels)


def test_absorb_bn_of_another_device_raises(two_devices):
    cpu, gpu = two_devices
    conv, bn = conv_on(cpu), bn_on(gpu)  # (no op runs on the fake GPU)
    with pytest.raises(cn.DeviceMismatchError) as info:
        conv.absorb_bn(bn)
    msg = str(info.value)
    assert "Conv2d.absorb_bn" in msg and "cpu" in msg and "gpu:0" in msg and ".to(" in msg


def test_absorb_bn_checks_channels_and_type():
    cpu = cn.Device.cpu()
    conv, bn1 = conv_on(cpu), bn_on(cpu, channels=1)  # would broadcast silently over 4 channels
    with pytest.raises(cn.ShapeMismatchError, match="1 channels.*4 output channels"):
        conv.absorb_bn(bn1)
    with pytest.raises(TypeError, match="BatchNorm2d"):
        conv.absorb_bn(cn.LayerNorm(None, None, device=cpu))


# -- embedding, sequential -----------------------------------------------------------------------
def test_embedding(device):
    r = rng(11)
    table = randn(r, 10, 7)
    emb = cn.Embedding.load(vb_of({"emb.weight": table}, device).pp("emb"), 10, 7)
    ids = np.array([[0, 9, 3], [3, 3, 1]], dtype=np.int32)
    close(emb(mx.array(ids)), f64(table)[ids])
    assert emb.embeddings.shape == (10, 7)


def test_sequential(device):
    r = rng(12)
    t = {"0.weight": randn(r, 16, 8), "0.bias": randn(r, 16), "2.weight": randn(r, 4, 16)}
    vb = vb_of(t, device)
    model = cn.seq([cn.Linear.load(vb.pp(0), 8, 16), cn.relu,
                    cn.Linear.load(vb.pp(2), 16, 4, bias=False),
                    cn.Activation("silu")])
    assert model.device == device and len(model) == 4
    x = randn(r, 3, 8)
    h = np.maximum(f64(x) @ f64(t["0.weight"]).T + f64(t["0.bias"]), 0) @ f64(t["2.weight"]).T
    close(model(mx.array(x)), h / (1 + np.exp(-h)))
    model.append(cn.Activation("sigmoid"))
    close(model(mx.array(x)), 1 / (1 + np.exp(-(h / (1 + np.exp(-h))))))


# -- activations ---------------------------------------------------------------------------------
ACT_REFS = ACTIVATIONS


@pytest.mark.parametrize("name", list(ACT_REFS))
def test_activation(device, name):
    x = np.concatenate([np.linspace(-8, 8, 401, dtype=np.float32), randn(rng(13), 99) * 3])
    ref = ACT_REFS[name](f64(x))
    close(on(device, getattr(cn, name), mx.array(x)), ref)
    close(on(device, cn.Activation(name), mx.array(x)), ref)
    close(on(device, cn.ACTIVATIONS[name], mx.array(x)), ref)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_gelu_is_mlxs_own_outside_the_cpu_fast_path(dtype):
    x = mx.array(randn(rng(13), 7, 33) * 3).astype(dtype)
    with cn.ops.disabled("cpu"):
        assert mx.array_equal(cn.gelu(x), mlx_nn.gelu(x))
        assert mx.array_equal(cn.gelu_tanh(x), mlx_nn.gelu_approx(x))


def test_gelu_exact_and_tanh_differ():
    x = mx.array(np.float32([1.5]))
    assert abs(cn.gelu(x).item() - cn.gelu_tanh(x).item()) > 1e-5


def test_unknown_activation_is_rejected():
    with pytest.raises(ValueError, match="unknown activation"):
        cn.Activation("swishy")


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax(device, axis):
    x = randn(rng(14), 3, 5, 7) * 10 + 50  # large offsets: needs the max subtraction
    close(on(device, cn.softmax, mx.array(x), axis=axis), ref_softmax(x, axis))


# -- upsampling ----------------------------------------------------------------------------------
def nearest_rows(size_in: int, size_out: int) -> np.ndarray:
    """PyTorch's ``mode="nearest"`` source indices, ``floor(dst * in / out)`` as its kernel
    computes it: in float32 (``scale = float(in) / out``), with exact paths for ``out == in`` and
    ``out == 2 * in``. For a few sizes (e.g. 4 -> 82) float32 rounding moves an index away from
    the exact rational floor; PyTorch's value is the reference."""
    if size_out == size_in:
        return np.arange(size_out)
    if size_out == 2 * size_in:
        return np.arange(size_out) >> 1
    scale = np.float32(size_in) / np.float32(size_out)
    idx = np.floor(np.arange(size_out, dtype=np.float32) * scale).astype(np.int64)
    return np.minimum(idx, size_in - 1)


def test_nearest_rule_reference():
    assert list(nearest_rows(2, 5)) == [0, 0, 0, 1, 1]
    assert list(nearest_rows(5, 3)) == [0, 1, 3]
    for size_in, size_out in [(5, 10), (5, 15), (7, 7), (3, 12)]:
        np.testing.assert_array_equal(nearest_rows(size_in, size_out),
                                      (np.arange(size_out) * size_in) // size_out)
    # where float32 and exact arithmetic part ways, PyTorch's float32 result is the reference
    assert not np.array_equal(nearest_rows(4, 82), (np.arange(82) * 4) // 82)


@pytest.mark.parametrize("size", [(10, 12), (15, 18), (20, 9), (7, 11), (13, 17), (3, 4), (5, 6),
                                  (8, 3), (2, 1), (4, 82), (82, 4)], ids=str)
@pytest.mark.parametrize("hw", [(5, 6), (4, 4)], ids=str)
def test_upsample_nearest2d(device, size, hw):
    h, w = hw
    x = randn(rng(15), 2, h, w, 3)
    oh, ow = size
    ref = x[:, nearest_rows(h, oh)][:, :, nearest_rows(w, ow)]
    got = on(device, cn.upsample_nearest2d, mx.array(x), oh, ow)
    assert got.shape == (2, oh, ow, 3)
    np.testing.assert_array_equal(np.array(got), ref)


# -- attention -----------------------------------------------------------------------------------
def ref_attention(q, k, v, scale, mask=None):
    s = f64(q) @ np.swapaxes(f64(k), -1, -2) * scale
    if mask is not None:
        s = s + (np.where(mask, 0.0, -np.inf) if mask.dtype == bool else f64(mask))
    return ref_softmax(s) @ f64(v)


@pytest.mark.parametrize("mask_kind", ["none", "additive", "additive_broadcast", "bool"])
def test_scaled_dot_product_attention(device, mask_kind):
    r = rng(16)
    b, h, lq, lk, d, dv = 2, 3, 5, 7, 16, 16
    q, k, v = randn(r, b, h, lq, d), randn(r, b, h, lk, d), randn(r, b, h, lk, dv)
    mask = None
    if mask_kind == "additive":
        mask = randn(r, b, h, lq, lk) * 2
    elif mask_kind == "additive_broadcast":
        mask = np.triu(np.full((lq, lk), -1e9, np.float32), 1)  # causal, (Lq, Lk)
    elif mask_kind == "bool":
        mask = np.tril(np.ones((lq, lk), bool), 2)
    scale = 1 / math.sqrt(d)
    ref = ref_attention(q, k, v, scale, mask)
    got = on(device, cn.scaled_dot_product_attention, mx.array(q), mx.array(k), mx.array(v),
             mask=None if mask is None else mx.array(mask))
    close(got, ref)
    got = on(device, cn.scaled_dot_product_attention, mx.array(q), mx.array(k), mx.array(v),
             scale=0.3, mask=None if mask is None else mx.array(mask))
    close(got, ref_attention(q, k, v, 0.3, mask))


def test_linear_on_a_vector(device):
    r = rng(17)
    w, b, x = randn(r, 5, 3), randn(r, 5), randn(r, 3)
    layer = cn.Linear.load(vb_of({"weight": w, "bias": b}, device), 3, 5)
    close(layer(mx.array(x)), f64(w) @ f64(x) + f64(b))


# -- half precision: no silent promotion to float32, values within the format's precision --------
HALF_TOL = {mx.float16: 1e-2, mx.bfloat16: 5e-2}  # a layout or dtype bug gives O(1)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
def test_half_precision_layers_keep_their_dtype(device, dtype):
    r = rng(18)
    t = {"fc.weight": randn(r, 8, 6), "fc.bias": randn(r, 8),
         "conv.weight": randn(r, 4, 3, 3, 3) * 0.3, "conv.bias": randn(r, 4),
         "up.weight": randn(r, 4, 2, 2, 2), "up.bias": randn(r, 2),
         "ln.weight": randn(r, 4), "ln.bias": randn(r, 4), "emb.weight": randn(r, 5, 4)}
    t.update({f"bn.{k}": v for k, v in bn_tensors(r, 4).items()})
    vb = cn.VarBuilder.from_tensors(t, dtype=dtype, device=device)
    assert vb.dtype == dtype
    fc = cn.Linear.load(vb.pp("fc"), 6, 8)
    conv = cn.Conv2d.load(vb.pp("conv"), 3, 4, 3, cn.Conv2dConfig(padding=1))
    bn = cn.BatchNorm2d.load(vb.pp("bn"), 4)
    folded = conv.absorb_bn(bn)
    up = cn.ConvTranspose2d.load(vb.pp("up"), 4, 2, 2, cn.ConvTranspose2dConfig(stride=2))
    ln = cn.LayerNorm.load(vb.pp("ln"), 4)
    emb = cn.Embedding.load(vb.pp("emb"), 5, 4)
    x, xl = randn(r, 1, 6, 6, 3), randn(r, 2, 6)
    xh = mx.array(x).astype(dtype)
    ref_c = ref_bn(ref_conv2d(x, t["conv.weight"], t["conv.bias"], padding=1),
                   {k[3:]: v for k, v in t.items() if k.startswith("bn.")}, 1e-5)
    outputs = {
        "linear": (fc(mx.array(xl).astype(dtype)),
                   f64(xl) @ f64(t["fc.weight"]).T + f64(t["fc.bias"])),
        "conv+bn": (bn(conv(xh)), ref_c),
        "folded": (folded(xh), ref_c),
        "conv_transpose": (up(mx.array(ref_c.astype(np.float32)).astype(dtype)),
                           ref_conv_transpose2d(ref_c, t["up.weight"], t["up.bias"], stride=2)),
        "layer_norm": (ln(mx.array(ref_c.astype(np.float32)).astype(dtype)),
                       ref_layer_norm(ref_c, t["ln.weight"], t["ln.bias"], 1e-5)),
        "embedding": (emb(mx.array(np.array([4, 0]))), f64(t["emb.weight"])[[4, 0]]),
    }
    for name, (got, ref) in outputs.items():
        assert got.dtype == dtype, f"{name}: {got.dtype}"
        close(got.astype(mx.float32), ref, HALF_TOL[dtype])
    with mx.stream(device.stream):
        for name in ACT_REFS:
            got = getattr(cn, name)(xh)
            assert got.dtype == dtype, name
            close(got.astype(mx.float32), ACT_REFS[name](f64(x)), HALF_TOL[dtype])
        q = mx.array(randn(r, 1, 2, 3, 8)).astype(dtype)
        mask = mx.array(randn(r, 3, 3))  # float32 additive mask on half-precision queries
        got = cn.scaled_dot_product_attention(q, q, q, mask=mask)
        assert got.dtype == dtype
        qf = np.array(q.astype(mx.float32))
        close(got.astype(mx.float32), ref_attention(qf, qf, qf, 1 / math.sqrt(8), np.array(mask)),
              HALF_TOL[dtype])
        assert cn.softmax(xh).dtype == dtype
        assert cn.upsample_nearest2d(xh, 9, 9).dtype == dtype
        assert cn.max_pool2d(xh, 2).dtype == cn.avg_pool2d(xh, 2).dtype == dtype


def test_silu_fast_cpu_path_is_accurate_over_the_whole_float32_range():
    """The CPU float32 SiLU uses a polynomial exp: check it ulp-close to float64 on a dense sweep,
    including saturation at both ends, and that NaN propagates."""
    with mx.stream(mx.cpu):
        xs = np.concatenate([np.linspace(-120, 120, 200_001), [0.0, -0.0, 1e-30, -1e-30]])
        got = np.array(cn.silu(mx.array(xs.astype(np.float32)))).astype(np.float64)
        assert np.isnan(np.array(cn.silu(mx.array([np.nan], dtype=mx.float32)))).all()
    x64 = xs.astype(np.float32).astype(np.float64)
    ref = x64 / (1.0 + np.exp(-x64))
    scale = np.maximum(np.abs(ref), 1e-30)
    big = np.abs(ref) > 1e-30  # below that only the absolute error matters
    assert np.max(np.abs(got - ref)[big] / scale[big]) < 1e-6
    assert np.max(np.abs(got - ref)[~big]) < 1e-35
