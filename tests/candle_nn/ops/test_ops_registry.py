"""The op registry (candle_nn/ops/registry.py): what every implementation declares, the switches
(by implementation, backend, op), dispatch under ``mx.grad``, and every op with its
implementations on and off against a float64 reference (the ``op_paths`` fixture)."""

from __future__ import annotations


import mlx.core as mx
import numpy as np
import pytest

from helpers.activation_reference import activation64
import candle_nn as cn
from candle_nn.backends.cpu import kernels

RNG = np.random.default_rng(2026)


def test_every_implementation_declares_what_it_works_around() -> None:
    rows = cn.ops.status()
    assert {r["op"] for r in rows} <= set(cn.ops.ops())
    for row in rows:
        assert row["backend"] in ("cpu", "cuda"), row
        assert row["grad"] in ("reference", "mlx", "own", "none"), row
        # own: the CUDA kernels, and the CPU's training paths (a VJP of their own)
        assert (row["grad"] == "own") is (row["backend"] == "cuda" or row["name"] in
                                          ("conv_grad", "batch_norm_vjp")), row
        assert row["works_around"] and row["mlx"] == mx.__version__, row
    names = {(r["op"], r["name"], r["backend"]) for r in rows}
    assert len(names) == len(rows)
    assert ("conv_transpose2d_blocks", "packed_gemm", "cpu") in names
    assert {"winograd", "packed_gemm", "im2col", "depthwise", "linear_rows", "layer_norm",
            "attention_packed", "attention_heads", "softmax", "bias_act", "dfl",
            "max_pool", "conv_grad", "batch_norm_vjp"} <= {r["name"] for r in rows}
    assert str(cn.info()).count("[cpu]") == sum(r["backend"] == "cpu" for r in rows)


def test_disabled_switches_and_restores() -> None:
    def on(name: str) -> dict[str, bool]:
        return {f"{r['op']}.{r['name']}": r["enabled"] for r in cn.ops.status()
                if name in (r["name"], r["backend"], r["op"])}

    assert all(on("cpu").values())
    with cn.ops.disabled("winograd"):
        assert on("winograd") == {"conv2d.winograd": False}
        assert cn.ops.is_enabled("packed_gemm") and not cn.ops.is_enabled("winograd")
        with cn.ops.disabled("cpu"):
            assert not any(on("cpu").values())
        assert sum(not v for v in on("cpu").values()) == 1
    with cn.ops.disabled("conv2d"):
        assert not any(on("conv2d").values()) and all(on("linear").values())
    with cn.ops.disabled("linear.packed_gemm"):
        assert on("packed_gemm") == {"conv2d.packed_gemm": True, "linear.packed_gemm": False,
                                     "conv_transpose2d_blocks.packed_gemm": True}
    with cn.ops.disabled("cuda:depthwise"):
        rows = {(r["backend"], r["name"]): r["enabled"] for r in cn.ops.status()
                if r["name"] == "depthwise"}
        assert rows == {("cpu", "depthwise"): True, ("cuda", "depthwise"): False}
    with cn.ops.only("softmax", backend="cpu"):
        enabled = {k for k, v in on("cpu").items() if v}
        assert enabled == {"softmax.softmax"}
    assert all(on("cpu").values()) and all(on("cuda").values())
    with pytest.raises(KeyError, match="no op, implementation or backend named"):
        cn.ops.disable("winogard")
    with pytest.raises(KeyError):
        with cn.ops.disabled("nothing-like-this"):
            pass


def _spy_op(grad: str) -> tuple[cn.ops.Op, list]:
    calls: list = []
    op = cn.ops.Op(lambda x: x * x, f"square_{grad}")
    op.add(cn.ops.Impl(op.name, "spy", "cpu", lambda x: calls.append(x.shape) or x * x,
                       lambda x: True, "a test", grad=grad))
    return op, calls


@pytest.mark.parametrize("grad", ["reference", "mlx"])
def test_grad_reference_routes_tracers_to_the_reference(grad: str) -> None:
    op, calls = _spy_op(grad)
    x = mx.array([1.0, 2.0, 3.0])
    assert op(x).tolist() == [1.0, 4.0, 9.0] and len(calls) == 1
    g = mx.grad(lambda v: op(v).sum())(x)
    assert g.tolist() == [2.0, 4.0, 6.0]
    # grad="reference": the implementation never sees a tracer (needs the kernels' is_tracer)
    expected = 1 if grad == "reference" and kernels.loaded() else 2
    assert len(calls) == expected


def test_the_benchmark_settings_name_registered_implementations() -> None:
    from benchmarks import bench_cpu_paths

    for setting, names in bench_cpu_paths._OFF.items():
        with cn.ops.disabled(*names):
            assert setting == "native" or not all(r["enabled"] for r in cn.ops.status())


# -- every op, implementations on and off, against float64 ------------------------------------
def _rel(ours: mx.array, ref: np.ndarray) -> float:
    ours = np.array(ours.astype(mx.float32), dtype=np.float64)
    assert ours.shape == ref.shape
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))


def _conv64(x, w, stride, padding, groups=1):
    n, h, wd, c = x.shape
    o, kh, kw, cg = w.shape
    (sh, sw), (ph, pw) = stride, padding
    xp = np.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    out = np.zeros((n, oh, ow, o))
    per = o // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw,
                           g * cg:(g + 1) * cg]
                out[..., g * per:(g + 1) * per] += patch @ w[g * per:(g + 1) * per, i, j, :].T
    return out


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("kernel,stride,padding,act", [
    (3, 1, 1, "silu"), (3, 2, 1, "relu"), (1, 1, 0, "gelu"), (5, 1, 2, "sigmoid"), (3, 1, 0, None),
])
def test_conv2d(op_paths, kernel, stride, padding, act) -> None:
    x, w, b, r = _f32(2, 11, 9, 16), _f32(24, kernel, kernel, 16), _f32(24), None
    ref = _conv64(x.astype(np.float64), w.astype(np.float64), (stride, stride),
                  (padding, padding)) + b
    r = _f32(*ref.shape)
    with mx.stream(mx.cpu):
        ours = cn.ops.conv2d(mx.array(x), mx.array(w), mx.array(b), (stride, stride),
                             (padding, padding), activation=act, residual=mx.array(r))
    assert _rel(ours, activation64(ref + r, act)) <= 2e-5, op_paths


@pytest.mark.parametrize("stride,act", [(1, "gelu"), (2, None)])
def test_depthwise_conv2d(op_paths, stride, act) -> None:
    x, w, b = _f32(2, 10, 12, 16), _f32(16, 3, 3, 1), _f32(16)
    ref = _conv64(x.astype(np.float64), w.astype(np.float64), (stride, stride), (1, 1),
                  groups=16) + b
    with mx.stream(mx.cpu):
        ours = cn.ops.depthwise_conv2d(mx.array(x), mx.array(w), mx.array(b), (stride, stride),
                                       (1, 1), activation=act)
    assert _rel(ours, activation64(ref, act)) <= 1e-5, op_paths


@pytest.mark.parametrize("kernel,act", [((2, 2), "gelu"), ((2, 3), None), ((1, 1), "relu")])
def test_conv_transpose2d_blocks(op_paths, kernel, act) -> None:
    """Stride = kernel: every input pixel's own ``kH x kW`` output block, in block layout, and
    in image order through ``blocks_to_image``."""
    (kh, kw), (n, h, w, c, o) = kernel, (2, 5, 7, 19, 20)
    x, wt, b = _f32(n, h, w, c), _f32(o, kh, kw, c), _f32(o)
    blocks = activation64(np.einsum("nhwc,oijc->nhwijo", x.astype(np.float64),
                                    wt.astype(np.float64)) + b, act)
    with mx.stream(mx.cpu):
        ours = cn.ops.conv_transpose2d_blocks(mx.array(x), mx.array(wt), mx.array(b), act)
        image = cn.ops.blocks_to_image(ours, (kh, kw))
    assert ours.shape == (n, h, w, kh * kw * o)
    assert _rel(ours, blocks.reshape(n, h, w, -1)) <= 1e-5, op_paths
    ref = blocks.transpose(0, 1, 3, 2, 4, 5).reshape(n, h * kh, w * kw, o)
    assert _rel(image, ref) <= 1e-5, op_paths


@pytest.mark.parametrize("rows", [1, 5, 40])
def test_linear(op_paths, rows) -> None:
    x, w, b = _f32(rows, 33), _f32(20, 33), _f32(20)
    res = _f32(rows, 20)
    ref = activation64(x.astype(np.float64) @ w.T.astype(np.float64) + b, "silu") + res
    with mx.stream(mx.cpu):
        ours = cn.ops.linear(mx.array(x), mx.array(w), mx.array(b), "silu", mx.array(res))
    assert _rel(ours, ref) <= 1e-5, op_paths


@pytest.mark.parametrize("rows", [3, 40])
def test_linear_weight_given_transposed(op_paths, rows) -> None:
    """A weight that is the transposed view of a row-major ``(in, out)`` array (``P @ v`` as
    ``linear(P, v.T)``) is packed as it is, and so is a slice of rows."""
    x, v, b = _f32(rows, 70), _f32(70, 37), _f32(37)
    ref = x.astype(np.float64) @ v.astype(np.float64) + b
    with mx.stream(mx.cpu):
        ours = cn.ops.linear(mx.array(x), mx.array(v).T, mx.array(b))
        sliced = cn.ops.linear(mx.array(x), mx.array(np.stack([v.T, v.T]))[1], mx.array(b))
    assert _rel(ours, ref) <= 1e-5, op_paths
    assert _rel(sliced, ref) <= 1e-5, op_paths


@pytest.mark.parametrize("name", ["silu", "gelu", "relu"])
def test_activations_and_bias_act(op_paths, name) -> None:
    y, b = _f32(7, 13) * 4, _f32(13)
    with mx.stream(mx.cpu):
        assert _rel(cn.ACTIVATIONS[name](mx.array(y)), activation64(y, name)) <= 1e-6
        ours = cn.ops.bias_act(mx.array(y), mx.array(b), name, mx.array(y), True)
    assert _rel(ours, activation64(y.astype(np.float64) + b, name) + y) <= 1e-6, op_paths


def test_softmax_and_layer_norm(op_paths) -> None:
    x, g, b = _f32(3, 5, 64) * 3, _f32(64), _f32(64)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    mean, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    with mx.stream(mx.cpu):
        assert _rel(cn.softmax(mx.array(x)), e / e.sum(-1, keepdims=True)) <= 1e-6
        ours = cn.ops.layer_norm(mx.array(x), mx.array(g), mx.array(b), 1e-5)
    assert _rel(ours, (x64 - mean) / np.sqrt(var + 1e-5) * g + b) <= 1e-5, op_paths


def _attention64(q, k, v, scale, bias=None):
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale + (0 if bias is None else bias)
    e = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", e / e.sum(-1, keepdims=True), v)


def test_attention_forms(op_paths) -> None:
    b, n, heads, d = 2, 9, 3, 8
    qkv, bias = _f32(b, n, heads * 3 * d), _f32(heads, n, n)
    q, k, v = np.split(qkv.astype(np.float64).reshape(b, n, heads, 3 * d).transpose(0, 2, 1, 3),
                       3, axis=-1)
    ref = _attention64(q, k, v, d ** -0.5, bias).transpose(0, 2, 1, 3).reshape(b, n, heads * d)
    qh, kh, vh = _f32(b, 4, heads * d), _f32(b, 30, heads * d), _f32(b, 30, heads * d)

    def split(t):
        return t.astype(np.float64).reshape(b, t.shape[1], heads, d).transpose(0, 2, 1, 3)

    ref_heads = _attention64(split(qh), split(kh), split(vh), d ** -0.5)
    with mx.stream(mx.cpu):
        packed = cn.packed_qkv_attention(mx.array(qkv), heads, bias=mx.array(bias))
        multi = cn.multi_head_attention(mx.array(qh), mx.array(kh), mx.array(vh), heads)
        sdpa = cn.scaled_dot_product_attention(mx.array(split(qh).astype(np.float32)),
                                               mx.array(split(kh).astype(np.float32)),
                                               mx.array(split(vh).astype(np.float32)))
    assert _rel(packed, ref) <= 1e-5, op_paths
    assert _rel(multi, ref_heads.transpose(0, 2, 1, 3).reshape(b, 4, heads * d)) <= 1e-5
    assert _rel(sdpa, ref_heads) <= 1e-5


def test_window_attention(op_paths) -> None:
    """An image's windows in place vs the float64 attention of each padded window."""
    b, h, w, heads, d, window = 2, 5, 7, 2, 8, 3
    qkv, bias, pad = _f32(b, h, w, heads * 3 * d), _f32(heads, 9, 9), _f32(heads * 3 * d)
    full = np.empty((b, 6, 9, heads * 3 * d))
    full[...] = pad
    full[:, :h, :w] = qkv
    win = full.reshape(b, 2, 3, 3, 3, -1).transpose(0, 1, 3, 2, 4, 5).reshape(-1, 9, 3 * heads * d)
    q, k, v = np.split(win.reshape(-1, 9, heads, 3 * d).transpose(0, 2, 1, 3), 3, axis=-1)
    ref = _attention64(q, k, v, d ** -0.5, bias).transpose(0, 2, 1, 3).reshape(b, 2, 3, 3, 3, -1)
    ref = ref.transpose(0, 1, 3, 2, 4, 5).reshape(b, 6, 9, -1)[:, :h, :w]
    with mx.stream(mx.cpu):
        ours = cn.window_attention(mx.array(qkv), heads, window, bias=mx.array(bias),
                                   pad=mx.array(pad))
    assert _rel(ours, ref) <= 1e-5, op_paths


def test_max_pool_and_dfl(op_paths) -> None:
    x = _f32(2, 7, 8, 5)
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    ref = np.stack([np.stack([xp[:, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max((1, 2))
                              for j in range(4)], 1) for i in range(4)], 1)
    logits, w = _f32(2, 6, 4, 16), np.arange(16, dtype=np.float32)
    e = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
    with mx.stream(mx.cpu):
        pooled = cn.max_pool2d(mx.array(x), 3, 2, 1)
        dfl = cn.ops.dfl_decode(mx.array(logits), mx.array(w.reshape(1, 1, 1, 16)))
    assert _rel(pooled, ref) == 0.0, op_paths
    assert _rel(dfl, (e / e.sum(-1, keepdims=True)) @ w) <= 1e-6


def _per_head64(shared: np.ndarray, tok: np.ndarray, b: int) -> np.ndarray:
    """``shared[h] @ tok[h, p t + u]`` as ``(b, n, heads t)`` in float64."""
    heads, n, d = shared.shape
    tok = tok.astype(np.float64).reshape(heads, b, -1, d)
    return np.einsum("hnd,hbud->bnhu", shared.astype(np.float64), tok).reshape(b, n, -1)


def _softmax64(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


# Shapes of the point ops' tests: n spans several row blocks of the kernels (64 and 48 rows) and
# K blocks (256), r = heads t = 6 columns padded to 8, m = 8 coefficients.
B, N, HEADS, T, D, M = 3, 300, 2, 3, 4, 8


@pytest.mark.parametrize("d", [D, 8])  # 8: the kernels' vector path for scale shared + pe
@pytest.mark.parametrize("form", ["positional", "factored"])
def test_point_probs(op_paths, form, d) -> None:
    pe, k = _f32(HEADS, N, d), _f32(HEADS, B * T, d)
    s = _per_head64(pe, k, B)
    args = {}
    if form == "factored":
        args = dict(scale=_f32(B, N) * 0.5 + 1, shared=_f32(HEADS, N, d), coeff=_f32(B, N, M),
                    fold=_f32(B, HEADS * T, M) * 0.5, bias=_f32(B, HEADS * T))
        s = (s + args["scale"][..., None] * _per_head64(args["shared"], k, B)
             + args["coeff"].astype(np.float64) @ args["fold"].swapaxes(1, 2)
             + args["bias"][:, None])
    ref = _softmax64(s.reshape(B, N, HEADS, T), -1).reshape(B, N, -1)
    with mx.stream(mx.cpu):
        ours = cn.ops.point_probs(mx.array(pe), mx.array(k), T,
                                  **{key: mx.array(v) for key, v in args.items()})
    assert _rel(ours, ref) <= 1e-5, op_paths


@pytest.mark.parametrize("form", ["first", "factored"])
def test_point_norm(op_paths, form) -> None:
    """A LayerNorm's ``1 / std`` of factored rows from their centred squared norm's parts,
    times the rows' coefficients ``u = [coeff, probs, 1?, 0...]``."""
    c = 24
    probs = _softmax64(_f32(B, N, HEADS, T).astype(np.float64), -1).reshape(B, N, -1)
    probs = probs.astype(np.float32)
    sq = (_f32(N) ** 2 + 100).astype(np.float32)  # |z|²: a variance far from 0
    lp_shared, lp_tok, lin0 = _f32(HEADS, N, D), _f32(HEADS, B * T, D), _f32(N)
    lin = lin0 + (probs * _per_head64(lp_shared, lp_tok, B)).sum(-1)
    parts = [probs]
    kwargs, s = {}, np.ones((B, N))
    if form == "factored":
        kwargs = dict(scale=_f32(B, N) * 0.2 + 1, coeff=_f32(B, N, M) * 0.3,
                      lc_shared=_f32(HEADS, N, 5), lc_tok=_f32(HEADS, B * 4, 5))
        s = kwargs["scale"].astype(np.float64)
        parts = [kwargs["coeff"], probs]
        lin = lin + (kwargs["coeff"] * _per_head64(kwargs["lc_shared"], kwargs["lc_tok"],
                                                   B)).sum(-1)
    u = np.concatenate(parts, -1).astype(np.float64)
    mu = -(-u.shape[-1] // 8) * 8
    u = np.concatenate([u, np.zeros((B, N, mu - u.shape[-1]))], -1)
    basis = _f32(B, mu, c).astype(np.float64)
    gram = (basis @ basis.swapaxes(1, 2)).astype(np.float32)
    quad = np.einsum("bnm,bmk,bnk->bn", u, gram.astype(np.float64), u)
    var = (s * s * sq + 2 * s * lin + quad) / c
    ref = u / np.sqrt(var + 1e-5)[..., None]
    gram = (basis @ basis.swapaxes(1, 2)).astype(np.float32)
    with mx.stream(mx.cpu):
        ours = cn.ops.point_norm(mx.array(probs), mx.array(sq), mx.array(lp_shared),
                                 mx.array(lp_tok), mx.array(lin0), mx.array(gram), 1e-5, c,
                                 **{key: mx.array(v) for key, v in kwargs.items()})
    assert _rel(ours, ref) <= 1e-5, op_paths


@pytest.mark.parametrize("d", [D, 8])
def test_point_pool(op_paths, d) -> None:
    dv = 8
    scale, coeff, fold = _f32(B, N) * 0.5 + 1, _f32(B, N, M), _f32(B, HEADS * T, M) * 0.5
    shared_k, pe, q, shared_v = (_f32(HEADS, N, d), _f32(HEADS, N, d), _f32(HEADS, B * T, d),
                                 _f32(HEADS, N, dv))
    s = (scale[..., None] * _per_head64(shared_k, q, B) + _per_head64(pe, q, B)
         + coeff.astype(np.float64) @ fold.swapaxes(1, 2).astype(np.float64))
    a = _softmax64(s, 1)  # (b, n, r): over the image tokens
    pooled = np.einsum("bnr,bnm->brm", a, coeff)
    weighted = (a * scale[..., None]).reshape(B, N, HEADS, T)
    values = np.einsum("bnhu,hnd->bhud", weighted, shared_v).reshape(B, HEADS * T, dv)
    ref = np.concatenate([pooled, values], -1)
    with mx.stream(mx.cpu):
        ours = cn.ops.point_pool(*(mx.array(x) for x in (scale, coeff, fold, shared_k, pe, q,
                                                         shared_v)))
    assert _rel(ours, ref) <= 1e-5, op_paths


@pytest.mark.parametrize("rows", [B * 7, 2 * 8 + 5, 13])  # groups of 7, of 8 and a rest, of 1
def test_point_pool_unfactored(op_paths, rows) -> None:
    """Without the factored inputs: per head the softmax over the image tokens of ``pe · q``
    times ``shared_v``, ``(heads, rows, dv)``."""
    pe, q, shared_v = _f32(HEADS, N, D), _f32(HEADS, rows, D), _f32(HEADS, N, 8)
    a = _softmax64(np.einsum("hnd,hrd->hrn", pe.astype(np.float64), q), -1)
    ref = a @ shared_v.astype(np.float64)
    with mx.stream(mx.cpu):
        ours = cn.ops.point_pool(None, None, None, None, mx.array(pe), mx.array(q),
                                 mx.array(shared_v))
    assert ours.shape == ref.shape
    assert _rel(ours, ref) <= 1e-5, op_paths


@pytest.mark.parametrize("n", [70, 37])  # token blocks of the kernel (32) and a part: 4 n rows
def test_mask_upscale(op_paths, n) -> None:  # of the LayerNorm, in groups of 8 and (37) a rest
    u, k, c1, c2, m = 2, 12, 8, 8, 3
    scale, shared, coeff = _f32(u, n) * 0.5 + 1, _f32(n, 4 * c1), _f32(u, n, k) * 0.3
    weight, bias = _f32(u, k, 4 * c1) * 0.3, _f32(4 * c1)
    lw, lb, w2, b2, hyper = _f32(c1), _f32(c1), _f32(4 * c2, c1) * 0.3, _f32(4 * c2), _f32(u, m, c2)
    x = (scale[..., None] * shared.astype(np.float64) + coeff.astype(np.float64) @ weight
         + bias).reshape(u, n * 4, c1)
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6) * lw + lb
    x = activation64(activation64(x, "gelu") @ w2.T.astype(np.float64) + b2, "gelu")
    x = x.reshape(u, n * 16, c2)
    ref = np.einsum("umc,upc->ump", hyper.astype(np.float64), x).reshape(u, m, n, 16)
    with mx.stream(mx.cpu):
        ours = cn.ops.mask_upscale(*(mx.array(a) for a in (scale, shared, coeff, weight, bias,
                                                           lw, lb)), 1e-6,
                                   *(mx.array(a) for a in (w2, b2, hyper)))
    assert _rel(ours, ref) <= 1e-5, op_paths


@pytest.mark.parametrize("w, ow", [(20, 50), (24, 48)])  # 24 -> 48: the kernel's 8-lane path
def test_mask_resize_and_stability(op_paths, w, ow) -> None:
    from candle_nn.upsample import bilinear_resize_matrix

    masks = _f32(3, 19, w) * 2
    rows = bilinear_resize_matrix(48, 37) @ bilinear_resize_matrix(19, 64, keep=48)  # banded
    cols = bilinear_resize_matrix(64, ow) @ bilinear_resize_matrix(w, 64)
    ref = np.einsum("yh,khw,xw->kyx", rows, masks.astype(np.float64), cols)
    with mx.stream(mx.cpu):
        ours = cn.ops.resize_masks(mx.array(masks), mx.array(rows.astype(np.float32)),
                                   mx.array(cols.astype(np.float32)))
        score = cn.ops.stability_score(mx.array(masks), 0.25, 1.0)
    assert _rel(ours, ref) <= 1e-5, op_paths
    expected = (masks > 1.25).sum((1, 2)) / (masks > -0.75).sum((1, 2))
    np.testing.assert_allclose(np.array(score), expected, rtol=1e-7)


@pytest.mark.parametrize("shape, heads, window, pad", [
    ((1, 5, 5, 25), 2, 3, None), ((1, 5, 5, 24), 2, 0, None), ((5, 5, 24), 2, 3, None),
    ((1, 5, 5, 24), 2, 3, (7,)),
])
def test_window_attention_rejects_bad_shapes(shape, heads, window, pad) -> None:
    """One ValueError naming the op and the expected layout, not an MLX reshape error."""
    pad = None if pad is None else mx.zeros(pad)
    with pytest.raises(ValueError, match="window_attention: .*(expected|one qkv row)"):
        cn.window_attention(mx.zeros(shape), heads, window, pad=pad)
