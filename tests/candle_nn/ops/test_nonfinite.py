"""NaN and +-Inf through every fast path: the op's output must be NaN / +-Inf exactly where the
plain-MLX reference (``cn.ops.disabled("cpu")``, what ``CANDLE_NN_CPU_FAST=0`` runs) gives
NaN / +-Inf, and close to it elsewhere.

Each case runs through the compiled kernels (where built) and the pure-MLX fallbacks (``path``
fixture, as tests/candle_nn/backends/test_cpu_native.py) on the CPU, and on every other device the
reference layers run on; the input has a NaN, a +Inf and a -Inf in different places (and a case with
a NaN weight), so a ReLU that maps NaN to 0 or a Winograd tile that smears one NaN over 16 outputs
fails.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import candle_nn as cn
from candle_nn.backends.cpu import kernels

NATIVE = kernels.module() is not None
ACTS = [None, "relu", "silu", "gelu", "sigmoid"]


def poisoned(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random float32 with a NaN, a +Inf and a -Inf at spread-out positions."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    n = flat.size
    flat[n // 7] = np.nan
    flat[(3 * n) // 5] = np.inf
    flat[(5 * n) // 6] = -np.inf
    return x


def same_nonfinite(fast_fn, *args) -> None:
    """``fast_fn(*args)`` with the fast paths on vs off: NaN/+-Inf at the same places, finite
    values within float32 rounding."""
    fast = np.array(fast_fn(*args))
    with cn.ops.disabled("cpu"):
        ref = np.array(fast_fn(*args))
    assert fast.shape == ref.shape
    assert np.isnan(ref).any() or np.isinf(ref).any(), "the case must produce non-finite values"
    np.testing.assert_array_equal(np.isnan(fast), np.isnan(ref), err_msg="NaN positions differ")
    np.testing.assert_array_equal(np.isposinf(fast), np.isposinf(ref), err_msg="+Inf differs")
    np.testing.assert_array_equal(np.isneginf(fast), np.isneginf(ref), err_msg="-Inf differs")
    finite = np.isfinite(ref)
    scale = max(float(np.abs(ref[finite]).max()), 1.0) if finite.any() else 1.0
    assert float(np.abs(fast[finite] - ref[finite]).max(initial=0.0)) <= 1e-4 * scale


def conv(x, w, b, stride, padding, activation, residual=None, groups=1):
    layer = cn.Conv2d(mx.array(w), mx.array(b),
                      cn.Conv2dConfig(stride=stride, padding=padding, groups=groups),
                      device=cn.Device.cpu())
    r = None if residual is None else mx.array(residual)
    return layer(mx.array(x), activation=activation, residual=r)


# (kernel, stride, padding, H): 3x3 stride 1 is the Winograd path, the others the packed GEMM /
# im2col + sgemm, 1x1 the matmul.
CONV_CASES = {"3x3s1": (3, 1, 1, 13), "3x3s2": (3, 2, 1, 13), "1x1": (1, 1, 0, 9),
              "7x7s2": (7, 2, 3, 17)}


@pytest.mark.parametrize("activation", ACTS, ids=str)
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_propagates_nonfinite_inputs(path, case, activation):
    k, stride, padding, h = CONV_CASES[case]
    r = np.random.default_rng(1)
    x = poisoned((2, h, h + 2, 16))
    w = r.standard_normal((24, k, k, 16)).astype(np.float32) * 0.2
    b = r.standard_normal(24).astype(np.float32)
    same_nonfinite(conv, x, w, b, stride, padding, activation)


@pytest.mark.parametrize("activation", ACTS, ids=str)
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_propagates_a_nan_weight_and_residual(path, case, activation):
    k, stride, padding, h = CONV_CASES[case]
    r = np.random.default_rng(2)
    x = r.standard_normal((1, h, h, 8)).astype(np.float32)
    w = r.standard_normal((16, k, k, 8)).astype(np.float32) * 0.2
    w[5, k // 2, k // 2, 3] = np.nan
    b = r.standard_normal(16).astype(np.float32)
    oh = (h + 2 * padding - k) // stride + 1
    residual = poisoned((1, oh, oh, 16), seed=3)
    same_nonfinite(conv, x, w, b, stride, padding, activation, residual)


@pytest.mark.parametrize("activation", ACTS)
def test_conv_transpose_blocks_propagates_nonfinite(path, activation):
    """SAM's upscaling (stride = kernel 2): a NaN/Inf input pixel or weight reaches its block."""
    x, w, b = poisoned((2, 6, 5, 24)), poisoned((16, 2, 2, 24), seed=1), poisoned((16,), seed=2)
    same_nonfinite(lambda *a: cn.ops.conv_transpose2d_blocks(*map(mx.array, a), activation),
                   x, w, b)


def test_all_nan_image_gives_nan_relu_conv(path):
    """The issue's case: an all-NaN input through conv + ReLU must not come out finite."""
    x = np.full((1, 12, 12, 8), np.nan, np.float32)
    w = np.ones((8, 3, 3, 8), np.float32)
    for stride in (1, 2):
        y = np.array(conv(x, w, np.zeros(8, np.float32), stride, 1, "relu"))
        assert np.isnan(y).all()


@pytest.mark.parametrize("activation", ACTS, ids=str)
def test_depthwise_conv_propagates_nonfinite(path, activation):
    r = np.random.default_rng(4)
    x = poisoned((2, 11, 9, 32))
    w = r.standard_normal((32, 3, 3, 1)).astype(np.float32)
    b = r.standard_normal(32).astype(np.float32)
    same_nonfinite(conv, x, w, b, 1, 1, activation, None, 32)


@pytest.mark.parametrize("activation", ACTS, ids=str)
@pytest.mark.parametrize("rows", [1, 3, 300])
def test_linear_propagates_nonfinite(path, activation, rows):
    r = np.random.default_rng(5)
    x = poisoned((rows, 64))
    w = mx.array(r.standard_normal((48, 64)).astype(np.float32))
    b = mx.array(r.standard_normal(48).astype(np.float32))
    layer = cn.Linear(w, b, device=cn.Device.cpu())
    same_nonfinite(lambda a: layer(mx.array(a), activation=activation), x)


@pytest.mark.parametrize("name", ["relu", "silu", "gelu", "sigmoid"])
def test_activations_propagate_nonfinite(path, name):
    x = poisoned((3, 70, 33))
    same_nonfinite(lambda a: getattr(cn, name)(mx.array(a)), x)


def test_softmax_propagates_nonfinite(path):
    x = poisoned((6, 4, 50))
    same_nonfinite(lambda a: cn.softmax(mx.array(a), axis=-1), x)


def test_layer_norm_propagates_nonfinite(path):
    x = poisoned((4, 9, 128))
    r = np.random.default_rng(6)
    norm = cn.LayerNorm(mx.array(r.standard_normal(128).astype(np.float32)),
                        mx.array(r.standard_normal(128).astype(np.float32)),
                        device=cn.Device.cpu())
    same_nonfinite(lambda a: norm(mx.array(a)), x)


def test_attention_propagates_nonfinite(path):
    qkv = poisoned((2, 40, 2 * 3 * 16))
    same_nonfinite(lambda a: cn.packed_qkv_attention(mx.array(a), 2), qkv)
    image, pad = poisoned((1, 9, 10, 2 * 3 * 8)), poisoned((2 * 3 * 8,), seed=4)
    same_nonfinite(lambda a, p: cn.window_attention(mx.array(a), 2, 4, pad=mx.array(p)),
                   image, pad)
    q, k, v = (poisoned((1, 30, 32), seed=s) for s in (7, 8, 9))
    same_nonfinite(lambda a, b, c: cn.multi_head_attention(mx.array(a), mx.array(b),
                                                           mx.array(c), 2), q, k, v)


def test_resnet_with_a_nan_weight_gives_nan_logits_and_the_cli_refuses(tmp_path, capsys):
    """The issue's case end to end: one NaN in a ResNet-18 file makes its logits NaN (as in
    PyTorch) through the fast paths, so candle-resnet's non-finite check fails the run."""
    from conftest import FIXTURES, fixture_dir, one_error_line

    from candle_nn_models.resnet import ResNet
    from candle_nn_models.scripts.resnet import main

    tensors = dict(mx.load(str(fixture_dir("resnet18") / "weights.safetensors")))
    w = np.array(tensors["layer1.0.conv1.weight"])
    w[3, 5, 1, 1] = np.nan
    tensors["layer1.0.conv1.weight"] = mx.array(w)
    path = tmp_path / "nan.safetensors"
    mx.save_safetensors(str(path), tensors)
    model = ResNet.load(cn.VarBuilder.from_safetensors(path), "resnet18")
    logits = np.array(model(mx.zeros((1, 64, 64, 3))))
    assert np.isnan(logits).all()
    nan_image = np.array(model(mx.full((1, 64, 64, 3), np.nan)))
    assert np.isnan(nan_image).all()
    assert main(["--image", str(FIXTURES / "images" / "bike.jpg"), "--weights", str(path)]) == 1
    one_error_line(capsys, "non-finite outputs")


# -- the same on every device (the CUDA kernels on a CUDA build) ----------------------------------
def _nan_windows(mask: np.ndarray, k: int, stride: int, padding: int) -> np.ndarray:
    """Output positions of a k x k window op whose window holds a NaN (NHWC mask, any channel
    for a full conv)."""
    m = np.pad(mask, [(0, 0), (padding, padding), (padding, padding), (0, 0)])
    oh = (m.shape[1] - k) // stride + 1
    ow = (m.shape[2] - k) // stride + 1
    out = np.zeros((m.shape[0], oh, ow, m.shape[3]), bool)
    for i in range(k):
        for j in range(k):
            out |= m[:, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
    return out


@pytest.mark.parametrize("op", ["conv_relu", "depthwise_relu", "max_pool"])
def test_nan_positions_on_every_device(device, op):
    x = np.random.default_rng(11).standard_normal((1, 12, 12, 8)).astype(np.float32)
    x[0, 2, 3, 1] = np.nan
    x[0, 8, 9, 6] = np.nan
    with mx.stream(device.stream):
        if op == "max_pool":
            y = cn.max_pool2d(mx.array(x), 3, 2, 1)
            want = _nan_windows(np.isnan(x), 3, 2, 1)
        else:
            groups = 8 if op == "depthwise_relu" else 1
            w = np.ones((8, 3, 3, 8 // groups), np.float32)
            layer = cn.Conv2d(mx.array(w), mx.zeros(8), cn.Conv2dConfig(padding=1, groups=groups),
                              device=device)
            y = layer(mx.array(x), activation="relu")
            nan = np.isnan(x)
            want = _nan_windows(nan if groups > 1 else nan.any(-1, keepdims=True), 3, 1, 1)
            want = np.broadcast_to(want, y.shape)
        got = np.isnan(np.array(y))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n", [90, 300])  # point_pool's softmax: one block of rows, or three
def test_point_attention_propagates_nonfinite(path, n):
    """The AMG decoder's attention on factored image tokens: a NaN / Inf coefficient (or
    probability) reaches the outputs as the plain ops' products, softmax and LayerNorm
    statistics carry it."""
    b, heads, t, d, m = 2, 2, 3, 4, 8
    r = np.random.default_rng(11)

    def f32(*shape):
        return mx.array(r.standard_normal(shape).astype(np.float32))

    pe, k, shared, scale = f32(heads, n, d), f32(heads, b * t, d), f32(heads, n, d), f32(b, n)
    fold, bias, shared_v = f32(b, heads * t, m), f32(b, heads * t), f32(heads, n, 8)
    same_nonfinite(lambda a: cn.ops.point_probs(pe, k, t, scale, shared, mx.array(a), fold,
                                                bias), poisoned((b, n, m)))
    same_nonfinite(lambda a: cn.ops.point_pool(scale, mx.array(a), fold, shared, pe, k,
                                               shared_v), poisoned((b, n, m)))
    same_nonfinite(lambda a: cn.ops.point_pool(None, None, None, None, mx.array(a), k,
                                               shared_v), poisoned((heads, n, d)))
    mu = 16
    basis = r.standard_normal((b, mu, 24))
    gram = mx.array((basis @ basis.swapaxes(1, 2)).astype(np.float32))
    sq = mx.array(np.full(n, 100.0, np.float32))
    norm_args = (f32(heads, n, d), k, f32(n), gram, 1e-5, 24, scale, f32(b, n, m),
                 f32(heads, n, 5), f32(heads, b * 4, 5))
    same_nonfinite(lambda a: cn.ops.point_norm(mx.array(a), sq, *norm_args),
                   poisoned((b, n, heads * t)))


def test_point_pool_running_maximum_nonfinite(path):
    """point_pool's softmax over the image rows runs block by block (128 rows) against each
    column's running maximum: scores that are -inf through the first blocks and finite later
    (head 2: finite outputs), a +Inf (head 0) and a NaN (head 1) in a late block give what the
    softmax over all rows at once gives."""
    heads, n, d, rows = 3, 300, 4, 8  # 8 rows: one tile of 8 tokens per head, no padding
    r = np.random.default_rng(13)
    pe = r.standard_normal((heads, n, d)).astype(np.float32)
    q = np.abs(r.standard_normal((heads, rows, d))).astype(np.float32) + 0.1  # -inf · q = -inf
    pe[:, :200, 0] = -np.inf
    pe[0, 250, 1] = np.inf
    pe[1, 260, 2] = np.nan
    shared_v = mx.array(r.standard_normal((heads, n, 8)).astype(np.float32))
    same_nonfinite(lambda a: cn.ops.point_pool(None, None, None, None, mx.array(a), mx.array(q),
                                               shared_v), pe)
    out = np.array(cn.ops.point_pool(None, None, None, None, mx.array(pe), mx.array(q),
                                     shared_v))
    assert np.isfinite(out[2]).all() and np.isnan(out[:2]).all()


def test_mask_upscale_propagates_nonfinite(path):
    u, n, k, c1, c2, m = 2, 40, 12, 8, 8, 3
    coeff = poisoned((u, n, k))
    r = np.random.default_rng(12)
    scale, shared = r.standard_normal((u, n)).astype(np.float32), r.standard_normal(
        (n, 4 * c1)).astype(np.float32)
    weight, bias = r.standard_normal((u, k, 4 * c1)).astype(np.float32), np.zeros(4 * c1,
                                                                                   np.float32)
    lw, lb = np.ones(c1, np.float32), np.zeros(c1, np.float32)
    w2, b2 = r.standard_normal((4 * c2, c1)).astype(np.float32), np.zeros(4 * c2, np.float32)
    hyper = r.standard_normal((u, m, c2)).astype(np.float32)
    same_nonfinite(lambda a: cn.ops.mask_upscale(
        mx.array(scale), mx.array(shared), mx.array(a), *(mx.array(x) for x in (
            weight, bias, lw, lb)), 1e-6, *(mx.array(x) for x in (w2, b2, hyper))), coeff)


@pytest.mark.parametrize("w, ow", [(20, 50), (24, 48)])  # 24 -> 48: the kernel's 8-lane path
def test_mask_resize_and_stability_with_nonfinite_logits(path, w, ow):
    """Resizing makes every pixel whose bilinear taps touch a NaN / Inf logit non-finite (the
    banded kernel exactly those, as PyTorch's interpolate; the dense reference product also
    the rest of their rows and columns, through 0 x NaN) and the other pixels equal to the
    resize of the finite logits. The stability score counts them as the plain comparisons do
    (NaN is above no threshold, +Inf above every one)."""
    from candle_nn.upsample import bilinear_resize_matrix

    masks = poisoned((3, 16, w))
    rows = bilinear_resize_matrix(48, 37) @ bilinear_resize_matrix(16, 64, keep=48)
    cols = bilinear_resize_matrix(64, ow) @ bilinear_resize_matrix(w, 64)
    with mx.stream(mx.cpu):
        fast = np.array(cn.ops.resize_masks(mx.array(masks), mx.array(rows.astype(np.float32)),
                                            mx.array(cols.astype(np.float32))))
    bad = ~np.isfinite(masks)
    touched = np.einsum("yh,khw,xw->kyx", (rows != 0) * 1.0, bad * 1.0, (cols != 0) * 1.0) > 0
    assert touched.any() and not np.isfinite(fast[touched]).any()
    if path == "native":  # the finite rest is checked below
        np.testing.assert_array_equal(~np.isfinite(fast), touched)
    ref = np.einsum("yh,khw,xw->kyx", rows, np.where(bad, 0.0, masks.astype(np.float64)), cols)
    finite = np.isfinite(fast)
    assert np.abs(fast[finite] - ref[finite]).max(initial=0.0) <= 1e-5
    with mx.stream(mx.cpu):
        score = np.array(cn.ops.stability_score(mx.array(masks), 0.25, 1.0))
        with cn.ops.disabled("cpu"):
            plain = np.array(cn.ops.stability_score(mx.array(masks), 0.25, 1.0))
    np.testing.assert_array_equal(score, plain)
