"""The op x device matrix's gradient column: every candle_nn layer's forward and gradients (of
its inputs and of each parameter, named and laid out as candle's checkpoints) against PyTorch
autograd in float64, on every available device, with the CPU fast paths on and off.

Under ``mx.grad`` the compiled CPU kernels see tracer inputs and build the same math from MLX's
differentiable ops (csrc/kernels.h); the pure-MLX fast paths (polynomial SiLU/GELU, the compiled
depthwise conv, softmax) are differentiated as they are. Either way the gradient must be
PyTorch's. Loss: ``sum(layer(inputs) * upstream)`` with a random ``upstream``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import candle_nn as cn
import mlx.core as mx
from candle_nn.checkpoint import state_dict
from conftest import PURE_MLX_CPU

TOL_OUT = 1e-5  # max|err| / max|ref|, float32 against float64
TOL_GRAD = 5e-5


@pytest.fixture(params=["on", "mlx_paths", "off"], ids=["fast_on", "fast_mlx_paths", "fast_off"])
def fast(request):
    """The CPU fast paths: on (the compiled kernels first), on without the compiled kernels (the
    pure-MLX paths: polynomial SiLU/GELU, the compiled depthwise conv), off."""
    if request.param == "off":
        with cn.ops.disabled("cpu"):
            yield request.param
    elif request.param == "mlx_paths":
        with cn.ops.only(*PURE_MLX_CPU, backend="cpu"):
            yield request.param
    else:
        yield request.param


@dataclass
class Case:
    """``tensors`` in candle's layout; ``inputs`` NHWC/NLC as candle_nn takes them; ``build(vb)``
    returns the layer, or ``(layer or None, function of the inputs)``; ``ref(params, *inputs)``
    computes the same in torch from float64 tensors in the same layouts."""

    build: Callable
    ref: Callable
    inputs: list[np.ndarray]
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    grad_inputs: bool = True


def r(seed: int, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def nchw(t: torch.Tensor) -> torch.Tensor:
    return t.permute(0, 3, 1, 2)


def nhwc(t: torch.Tensor) -> torch.Tensor:
    return t.permute(0, 2, 3, 1)


def conv_case(cin, cout, k, padding=0, stride=1, dilation=1, groups=1, hw=(9, 8), act=None,
              residual=False) -> Case:
    t = {"weight": r(1, cout, cin // groups, k, k, scale=0.3), "bias": r(2, cout)}
    x = r(3, 2, *hw, cin)
    oh = (hw[0] + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    ow = (hw[1] + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    inputs = [x] + ([r(4, 2, oh, ow, cout)] if residual else [])
    config = cn.Conv2dConfig(padding=padding, stride=stride, dilation=dilation, groups=groups)

    def build(vb):
        conv = cn.Conv2d.load(vb, cin, cout, k, config)
        return conv, lambda x, *res: conv(x, activation=act, residual=res[0] if res else None)

    def ref(p, x, *res):
        y = nhwc(F.conv2d(nchw(x), p["weight"], p["bias"], stride, padding, dilation, groups))
        y = y + res[0] if res else y
        return TORCH_ACTS[act](y) if act else y

    return Case(build, ref, inputs, t)


def convt_case(cin, cout, k, padding=0, output_padding=0, stride=1, dilation=1) -> Case:
    t = {"weight": r(5, cin, cout, k, k, scale=0.3), "bias": r(6, cout)}
    config = cn.ConvTranspose2dConfig(padding=padding, output_padding=output_padding,
                                      stride=stride, dilation=dilation)
    return Case(lambda vb: cn.ConvTranspose2d.load(vb, cin, cout, k, config),
                lambda p, x: nhwc(F.conv_transpose2d(nchw(x), p["weight"], p["bias"], stride,
                                                     padding, output_padding, 1, dilation)),
                [r(7, 2, 5, 4, cin)], t)


def conv1d_case(cin, cout, k, padding=0, stride=1, dilation=1, groups=1) -> Case:
    t = {"weight": r(8, cout, cin // groups, k, scale=0.3), "bias": r(9, cout)}
    config = cn.Conv1dConfig(padding=padding, stride=stride, dilation=dilation, groups=groups)
    return Case(lambda vb: cn.Conv1d.load(vb, cin, cout, k, config),
                lambda p, x: F.conv1d(x.transpose(1, 2), p["weight"], p["bias"], stride, padding,
                                      dilation, groups).transpose(1, 2),
                [r(10, 2, 11, cin)], t)


def convt1d_case(cin, cout, k, padding=0, output_padding=0, stride=1, dilation=1,
                 groups=1) -> Case:
    t = {"weight": r(11, cin, cout // groups, k, scale=0.3), "bias": r(12, cout)}
    config = cn.ConvTranspose1dConfig(padding=padding, output_padding=output_padding,
                                      stride=stride, dilation=dilation, groups=groups)
    return Case(lambda vb: cn.ConvTranspose1d.load(vb, cin, cout, k, config),
                lambda p, x: F.conv_transpose1d(x.transpose(1, 2), p["weight"], p["bias"], stride,
                                                padding, output_padding, groups,
                                                dilation).transpose(1, 2),
                [r(13, 2, 7, cin)], t)


TORCH_ACTS = {"relu": torch.relu, "silu": F.silu, "gelu": F.gelu, "sigmoid": torch.sigmoid,
              "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


def bn_tensors(c: int) -> dict[str, np.ndarray]:
    return {"running_mean": r(14, c), "running_var": np.abs(r(15, c)) + 0.5,
            "weight": r(16, c), "bias": r(17, c)}


def bn_case(train: bool) -> Case:
    def build(vb):
        bn = cn.BatchNorm2d.load(vb, 6)
        return bn.train() if train else bn

    def ref(p, x):
        return nhwc(F.batch_norm(nchw(x), p["running_mean"].detach().clone(),
                                 p["running_var"].detach().clone(), p["weight"], p["bias"],
                                 training=train, eps=1e-5))

    return Case(build, ref, [r(18, 3, 4, 5, 6, scale=2)], bn_tensors(6))


def conv_bn_case() -> Case:
    t = {"conv.weight": r(19, 6, 4, 3, 3, scale=0.3),
         **{f"bn.{k}": v for k, v in bn_tensors(6).items()}}

    def build(vb):
        layer = cn.ConvBn.load(vb, 4, 6, 3, cn.Conv2dConfig(padding=1), fold_bn=False).train()
        return layer, lambda x, res: layer(x, activation="relu", residual=res)

    def ref(p, x, res):
        y = F.conv2d(nchw(x), p["conv.weight"], None, 1, 1)
        y = F.batch_norm(y, None, None, p["bn.weight"], p["bn.bias"], training=True, eps=1e-5)
        return torch.relu(nhwc(y) + res)

    return Case(build, ref, [r(20, 2, 5, 6, 4), r(21, 2, 5, 6, 6)], t)


def ln_case(kind: str) -> Case:
    c = 8
    t = {"weight": r(22, c), "bias": r(23, c)}
    if kind == "rms":
        t = {"weight": r(22, c)}
        config = cn.LayerNormConfig(eps=1e-5, remove_mean=False)
        return Case(lambda vb: cn.LayerNorm.load(vb, c, config),
                    lambda p, x: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5)
                    * p["weight"], [r(24, 3, 5, c)], t)
    if kind == "2d":
        return Case(lambda vb: cn.LayerNorm2d.load(vb, c),
                    lambda p, x: F.layer_norm(x, (c,), p["weight"], p["bias"], 1e-6),
                    [r(25, 2, 3, 4, c)], t)
    return Case(lambda vb: cn.LayerNorm.load(vb, c, 1e-5),
                lambda p, x: F.layer_norm(x, (c,), p["weight"], p["bias"], 1e-5),
                [r(26, 3, 5, c, scale=3)], t)


def gn_case() -> Case:
    t = {"weight": r(27, 8), "bias": r(28, 8)}
    return Case(lambda vb: cn.GroupNorm.load(vb, 4, 8),
                lambda p, x: nhwc(F.group_norm(nchw(x), 4, p["weight"], p["bias"], 1e-5)),
                [r(29, 2, 3, 5, 8, scale=2)], t)


def linear_case(rows: int, act=None) -> Case:
    t = {"weight": r(30, 7, 9, scale=0.3), "bias": r(31, 7)}

    def build(vb):
        lin = cn.Linear.load(vb, 9, 7)
        return lin, lambda x: lin(x, activation=act)

    def ref(p, x):
        y = F.linear(x, p["weight"], p["bias"])
        return TORCH_ACTS[act](y) if act else y

    return Case(build, ref, [r(32, rows, 9)], t)


def embedding_case() -> Case:
    ids = np.array([[1, 4, 4], [0, 9, 2]], dtype=np.int32)
    t = {"weight": r(33, 10, 5)}
    def build(vb):
        emb = cn.Embedding.load(vb, 10, 5)
        return emb, lambda: emb(mx.array(ids))

    return Case(build,
                lambda p: F.embedding(torch.tensor(ids, dtype=torch.long), p["weight"]), [], t)


def fn_case(fn, ref, *inputs) -> Case:
    return Case(lambda vb: (None, fn), ref, list(inputs))


def sdpa_ref(q, k, v, scale=None, mask=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    return torch.softmax(s if mask is None else s + mask, -1) @ v


def heads(x, h):
    return x.reshape(x.shape[0], x.shape[1], h, -1).transpose(1, 2)


def unheads(x):
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)


def packed_ref(qkv, h):
    b, n, w = qkv.shape
    q, k, v = qkv.reshape(b, n, h, 3 * (w // (3 * h))).transpose(1, 2).chunk(3, -1)
    return unheads(sdpa_ref(q, k, v))


def window_ref(qkv, pad, h, window):
    """Pad to whole windows with the pad row, packed attention per window, merge, crop."""
    b, hh, ww, c3 = qkv.shape
    hp, wp = -(-hh // window) * window, -(-ww // window) * window
    full = pad.expand(b, hp, wp, c3).clone()
    full[:, :hh, :ww] = qkv
    nh, nw = hp // window, wp // window
    win = full.reshape(b, nh, window, nw, window, c3).permute(0, 1, 3, 2, 4, 5)
    out = packed_ref(win.reshape(-1, window * window, c3), h)
    out = out.reshape(b, nh, nw, window, window, -1).permute(0, 1, 3, 2, 4, 5)
    return out.reshape(b, hp, wp, -1)[:, :hh, :ww]


CASES: dict[str, Callable[[], Case]] = {
    "linear": lambda: linear_case(12),
    "linear_few_rows_gelu": lambda: linear_case(3, "gelu"),
    "linear_relu": lambda: linear_case(20, "relu"),
    "dropout_eval": lambda: Case(lambda vb: cn.Dropout(0.3).eval(), lambda p, x: x,
                                 [r(52, 3, 7)]),
    "conv3x3": lambda: conv_case(5, 6, 3, padding=1),
    "conv3x3_winograd_silu_residual": lambda: conv_case(8, 8, 3, padding=1, hw=(12, 12),
                                                        act="silu", residual=True),
    "conv_stride2": lambda: conv_case(4, 6, 3, padding=1, stride=2, act="relu"),
    "conv7x7_stride2": lambda: conv_case(3, 4, 7, padding=3, stride=2, hw=(14, 13)),
    "conv1x1": lambda: conv_case(5, 7, 1, act="gelu"),
    "conv_groups": lambda: conv_case(6, 4, 3, padding=1, groups=2),
    "conv_dilation": lambda: conv_case(4, 5, 3, padding=2, dilation=2),
    "depthwise": lambda: conv_case(8, 8, 3, padding=1, groups=8, act="silu"),
    "depthwise_stride2_residual": lambda: conv_case(8, 8, 3, padding=1, stride=2, groups=8,
                                                    residual=True),
    "conv_transpose_k2s2": lambda: convt_case(4, 3, 2, stride=2),
    "conv_transpose_k3s2": lambda: convt_case(4, 3, 3, padding=1, output_padding=1, stride=2),
    "conv_transpose_dilation": lambda: convt_case(3, 2, 3, dilation=2),
    "conv1d": lambda: conv1d_case(4, 6, 3, padding=1),
    "conv1d_strided_dilated_groups": lambda: conv1d_case(6, 4, 3, padding=2, stride=2,
                                                         dilation=2, groups=2),
    "conv_transpose1d": lambda: convt1d_case(4, 3, 3, padding=1, output_padding=1, stride=2),
    "conv_transpose1d_groups_dilation": lambda: convt1d_case(4, 6, 3, padding=2, stride=3,
                                                             dilation=2, groups=2,
                                                             output_padding=2),
    "batch_norm_eval": lambda: bn_case(False),
    "batch_norm_train": lambda: bn_case(True),
    "conv_bn_train_relu_residual": conv_bn_case,
    "layer_norm": lambda: ln_case("ln"),
    "rms_norm": lambda: ln_case("rms"),
    "layer_norm2d": lambda: ln_case("2d"),
    "group_norm": gn_case,
    "embedding": embedding_case,
    "max_pool": lambda: fn_case(lambda x: cn.max_pool2d(x, 3, 2, 1),
                                lambda p, x: nhwc(F.max_pool2d(nchw(x), 3, 2, 1)),
                                r(34, 2, 7, 6, 3)),
    "avg_pool": lambda: fn_case(lambda x: cn.avg_pool2d(x, 3, 2, 1),
                                lambda p, x: nhwc(F.avg_pool2d(nchw(x), 3, 2, 1)),
                                r(35, 2, 7, 6, 3)),
    **{f"act_{name}": (lambda name=name: fn_case(
        cn.ACTIVATIONS[name], lambda p, x: TORCH_ACTS[name](x), r(36, 4, 33, scale=3)))
       for name in ("relu", "silu", "gelu", "gelu_tanh", "sigmoid")},
    "softmax": lambda: fn_case(cn.softmax, lambda p, x: torch.softmax(x, -1), r(37, 3, 4, 9)),
    "upsample_nearest": lambda: fn_case(
        lambda x: cn.upsample_nearest2d(x, 10, 9),
        lambda p, x: nhwc(F.interpolate(nchw(x), (10, 9), mode="nearest")), r(38, 2, 4, 3, 2)),
    "upsample_nearest_x2": lambda: fn_case(
        lambda x: cn.upsample_nearest2d(x, 8, 6),
        lambda p, x: nhwc(F.interpolate(nchw(x), (8, 6), mode="nearest")), r(39, 2, 4, 3, 2)),
    "upsample_bilinear": lambda: fn_case(
        lambda x: cn.upsample_bilinear2d(x, 9, 7),
        lambda p, x: nhwc(F.interpolate(nchw(x), (9, 7), mode="bilinear",
                                        align_corners=False)), r(40, 2, 4, 3, 2)),
    "sdpa": lambda: fn_case(lambda q, k, v: cn.scaled_dot_product_attention(q, k, v),
                            lambda p, q, k, v: sdpa_ref(q, k, v),
                            r(41, 2, 2, 5, 4), r(42, 2, 2, 6, 4), r(43, 2, 2, 6, 3)),
    "sdpa_additive_mask": lambda: fn_case(
        lambda q, k, v, m: cn.scaled_dot_product_attention(q, k, v, mask=m, scale=0.3),
        lambda p, q, k, v, m: sdpa_ref(q, k, v, 0.3, m),
        r(44, 1, 2, 5, 4), r(45, 1, 2, 6, 4), r(46, 1, 2, 6, 3), r(47, 1, 2, 5, 6)),
    "packed_qkv_attention": lambda: fn_case(lambda qkv: cn.packed_qkv_attention(qkv, 2),
                                            lambda p, qkv: packed_ref(qkv, 2), r(48, 2, 7, 24)),
    "window_attention": lambda: fn_case(
        lambda qkv, pad: cn.window_attention(qkv, 2, 3, pad=pad),
        lambda p, qkv, pad: window_ref(qkv, pad, 2, 3), r(53, 2, 4, 5, 24), r(54, 24)),
    "multi_head_attention": lambda: fn_case(
        lambda q, k, v: cn.multi_head_attention(q, k, v, 2),
        lambda p, q, k, v: unheads(sdpa_ref(heads(q, 2), heads(k, 2), heads(v, 2))),
        r(49, 2, 5, 8), r(50, 2, 9, 8), r(51, 2, 9, 6)),
}


def rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def ours_with_grads(case: Case, device: cn.Device, upstream: np.ndarray | None):
    """``(output, input grads, parameter grads by candle name)`` of candle_nn's layer."""
    vb = cn.VarBuilder.from_tensors(case.tensors, device=device)
    built = case.build(vb)
    module, layer = built if isinstance(built, tuple) else (built, built)
    xs = [mx.array(x) for x in case.inputs]
    params = module.trainable_parameters() if module is not None else {}
    up = None if upstream is None else mx.array(upstream)

    def loss(params, *xs):
        if module is not None:
            module.update(params)
        out = layer(*xs)
        return (out * up).sum() if up is not None else out.sum(), out

    with mx.stream(device.stream):
        if module is not None and case.tensors:
            start = module.parameters()
        argnums = tuple(range(1 + (len(xs) if case.grad_inputs else 0)))
        (_, out), grads = mx.value_and_grad(loss, argnums=argnums)(params, *xs)
        grads = grads if isinstance(grads, tuple) else (grads,)
        mx.eval(out, grads)
        if module is not None and case.tensors:
            module.update(start)
    named = {}
    if module is not None and case.tensors:
        module.update(grads[0])
        named = {k.lstrip("."): np.array(v) for k, v in state_dict(module).items()
                 if "running" not in k}  # a layer at the VarBuilder's root: names ".weight"
        module.update(start)
    return np.array(out), [np.array(g) for g in grads[1:]], named


def torch_with_grads(case: Case, upstream: np.ndarray | None):
    params = {k: torch.tensor(v, dtype=torch.float64, requires_grad="running" not in k)
              for k, v in case.tensors.items()}
    xs = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in case.inputs]
    out = case.ref(params, *xs)
    loss = (out * torch.tensor(upstream, dtype=torch.float64)).sum() if upstream is not None \
        else out.sum()
    loss.backward()
    return (out.detach().numpy(), [x.grad.numpy() for x in xs],
            {k: p.grad.numpy() for k, p in params.items() if p.requires_grad})


@pytest.mark.parametrize("name", list(CASES))
def test_gradient_matches_torch(device, fast, name):
    case = CASES[name]()
    with torch.no_grad():
        shape = case.ref({k: torch.tensor(v, dtype=torch.float64)
                          for k, v in case.tensors.items()},
                         *[torch.tensor(x, dtype=torch.float64) for x in case.inputs]).shape
    upstream = r(99, *shape)
    out, gx, gp = ours_with_grads(case, device, upstream)
    ref_out, ref_gx, ref_gp = torch_with_grads(case, upstream)
    assert rel(out, ref_out) <= TOL_OUT, f"output: {rel(out, ref_out):.2e}"
    assert len(gx) == len(ref_gx)
    for i, (a, b) in enumerate(zip(gx, ref_gx)):
        assert rel(a, b) <= TOL_GRAD, f"input {i} gradient: {rel(a, b):.2e}"
    assert set(gp) == set(ref_gp), (set(gp), set(ref_gp))
    for k in gp:
        assert rel(gp[k], ref_gp[k]) <= TOL_GRAD, f"{k} gradient: {rel(gp[k], ref_gp[k]):.2e}"
