"""The mask decoder's reordered computations against the direct ones: attention between a few
prompt tokens and many image tokens with the few tokens' side folded into the projection
weights (float64 NumPy reference, and the gradient of the direct form), and the dense
positional encoding computed once per grid and matrix."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import candle_nn as cn
from candle_nn_models.segment_anything.prompt_encoder import PositionEmbeddingRandom
from candle_nn_models.segment_anything.transformer import Attention

DIM, HEADS, TOKENS, IMAGE = 64, 4, 5, 48  # folded: HEADS * TOKENS < min(DIM, IMAGE)


def test_the_decoder_shapes_take_the_folded_paths(monkeypatch):
    """Tokens → image takes :meth:`Attention._few_queries`, image → tokens
    :meth:`Attention._few_keys`, tokens → tokens the direct order."""
    attn, calls = attention(), []
    for name in ("_few_queries", "_few_keys"):
        original = getattr(Attention, name)
        monkeypatch.setattr(Attention, name,
                            lambda *a, n=name, f=original: calls.append(n) or f(*a))
    tokens, image = mx.zeros((1, TOKENS, DIM)), mx.zeros((1, IMAGE, DIM))
    with attn.on_device():
        attn(tokens, image, image)
        attn(image, tokens, tokens)
        attn(tokens, tokens, tokens)
    assert calls == ["_few_queries", "_few_keys"]


def attention() -> Attention:
    vb = cn.VarBuilder.from_varmap(cn.VarMap(), seed=3, device="cpu")
    attn = Attention.load(vb, DIM, HEADS)
    rng = np.random.default_rng(4)  # non-zero biases: the folding must account for each
    for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
        lin.bias = mx.array(rng.uniform(-0.5, 0.5, lin.bias.shape).astype(np.float32))
    return attn


def direct(p: dict, q, k, v, heads: int, xp=mx):
    """Attention in the direct order (project, score, softmax, pool, project), with MLX or
    NumPy (``xp``) arrays; ``p`` the module's parameters."""
    def lin(x, name):
        return x @ xp.asarray(p[name]["weight"]).T + xp.asarray(p[name]["bias"])

    def split(x):
        b, n, _ = x.shape
        return x.reshape(b, n, heads, -1).transpose(0, 2, 1, 3)

    qh, kh, vh = split(lin(q, "q_proj")), split(lin(k, "k_proj")), split(lin(v, "v_proj"))
    s = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(qh.shape[-1])
    e = xp.exp(s - s.max(axis=-1, keepdims=True))
    out = (e / e.sum(axis=-1, keepdims=True)) @ vh
    b, _, n, _ = out.shape
    return lin(out.transpose(0, 2, 1, 3).reshape(b, n, -1), "out_proj")


def params64(attn: Attention) -> dict:
    return {name: {k: np.array(a, dtype=np.float64) for k, a in lin.items()}
            for name, lin in attn.parameters().items()}


@pytest.mark.parametrize("image_batch", [2, 1])
def test_folded_attention_matches_float64(image_batch):
    """Tokens → image (few queries; one image broadcast over the prompts when its batch is 1)
    and image → tokens (few keys, with the residual) against float64."""
    attn = attention()
    rng = np.random.default_rng(5)
    tokens = rng.standard_normal((2, TOKENS, DIM)).astype(np.float32)
    image = rng.standard_normal((image_batch, IMAGE, DIM)).astype(np.float32)
    p = params64(attn)
    t64, i64 = tokens.astype(np.float64), np.broadcast_to(image, (2, IMAGE, DIM)).astype(np.float64)
    with attn.on_device():
        to_image = np.array(attn(mx.array(tokens), mx.array(image), mx.array(image)))
        to_tokens = np.array(attn(mx.array(image), mx.array(tokens), mx.array(tokens),
                                  residual=mx.array(image)))
    want = direct(p, t64, i64, i64, HEADS, np)
    assert np.abs(to_image - want).max() <= 1e-5 * np.abs(want).max()
    want = i64 + direct(p, i64, t64, t64, HEADS, np)
    assert np.abs(to_tokens - want).max() <= 1e-5 * np.abs(want).max()


def test_folded_attention_gradients_match_the_direct_order():
    """``mx.grad`` through both folded paths: every parameter's and input's gradient equals the
    direct order's."""
    attn = attention()
    rng = np.random.default_rng(6)
    tokens = mx.array(rng.standard_normal((2, TOKENS, DIM)).astype(np.float32))
    image = mx.array(rng.standard_normal((2, IMAGE, DIM)).astype(np.float32))
    w1, w2 = (mx.array(rng.standard_normal(s).astype(np.float32))
              for s in ((2, TOKENS, DIM), (2, IMAGE, DIM)))

    def loss(out_tokens, out_image):
        return (out_tokens * w1).sum() + (out_image * w2).sum()

    def folded(params, tokens, image):
        attn.update(params)
        return loss(attn(tokens, image, image), attn(image, tokens, tokens, residual=image))

    def reference(params, tokens, image):
        return loss(direct(params, tokens, image, image, HEADS),
                    image + direct(params, image, tokens, tokens, HEADS))

    params = attn.parameters()
    with attn.on_device():
        got = mx.grad(folded, argnums=(0, 1, 2))(params, tokens, image)
        want = mx.grad(reference, argnums=(0, 1, 2))(params, tokens, image)
    got_flat, want_flat = dict(nn.utils.tree_flatten(got)), dict(nn.utils.tree_flatten(want))
    # The key bias's true gradient is 0 (softmax drops it): both sides are rounding noise there.
    scale = max(float(np.abs(np.array(w)).max()) for w in want_flat.values())
    assert float(np.abs(np.array(want_flat["0.k_proj.bias"])).max()) <= 1e-4 * scale
    for name, w in want_flat.items():
        g, w = np.array(got_flat[name]), np.array(w)
        assert np.abs(g - w).max() <= max(1e-4 * np.abs(w).max(), 1e-5 * scale), name


def test_dense_positional_encoding_is_computed_once_per_grid_and_matrix():
    """The same array for the same grid and matrix; a new matrix (loaded, or a tracer under
    ``mx.grad``) gets its own encoding and its gradient."""
    rng = np.random.default_rng(7)
    pe = PositionEmbeddingRandom(mx.array(rng.standard_normal((2, 8)).astype(np.float32)),
                                 device=cn.Device.cpu())
    with pe.on_device():
        first = pe(6, 5)
        assert pe(6, 5) is first and pe(5, 6) is not first
        np.testing.assert_array_equal(np.array(first), np.array(pe._grid(6, 5)))
        pe.positional_encoding_gaussian_matrix = mx.array(
            rng.standard_normal((2, 8)).astype(np.float32))
        second = pe(6, 5)
        assert second is not first
        np.testing.assert_array_equal(np.array(second), np.array(pe._grid(6, 5)))

        weights = mx.array(rng.standard_normal((6, 5, 16)).astype(np.float32))
        grad = nn.value_and_grad(pe, lambda m: (m(6, 5) * weights).sum())(pe)[1]
        want = nn.value_and_grad(pe, lambda m: (m._grid(6, 5) * weights).sum())(pe)[1]
        g = np.array(grad["positional_encoding_gaussian_matrix"])
        w = np.array(want["positional_encoding_gaussian_matrix"])
        assert np.abs(w).max() > 0 and np.abs(g - w).max() <= 1e-5 * np.abs(w).max()
        np.testing.assert_array_equal(np.array(pe(6, 5)), np.array(second))


def test_a_batch_of_prompts_decodes_as_each_prompt_alone():
    """``Sam.forward`` with two point prompts (one image, the per-prompt products of the folded
    attention and of the masks' Linear) equals two calls with one prompt each."""
    from conftest import fixture_dir

    from candle_nn_models.segment_anything import Sam

    sam = Sam.load(cn.VarBuilder.from_safetensors(fixture_dir("mobile_sam") /
                                                  "weights.safetensors"))
    rng = np.random.default_rng(8)
    embedding = mx.array(rng.standard_normal((1, 64, 64, 256)).astype(np.float32))
    coords = mx.array(rng.uniform(0, 1024, (2, 2, 2)).astype(np.float32))
    labels = mx.array([[1, 0], [1, 1]])
    masks, iou = sam(embedding, (coords, labels))
    assert masks.shape == (2, 256, 256, 3) and iou.shape == (2, 3)
    for i in range(2):
        one, one_iou = sam(embedding, (coords[i:i + 1], labels[i:i + 1]))
        scale = float(np.abs(np.array(one)).max())
        assert np.abs(np.array(masks[i:i + 1]) - np.array(one)).max() <= 1e-5 * scale
        np.testing.assert_allclose(np.array(iou[i:i + 1]), np.array(one_iou), rtol=1e-5,
                                   atol=1e-6)
