"""SAM's ViT image encoder (ViT-B/L/H family) against a NumPy float64 transcription of SAM's
``image_encoder.py``, on a small random configuration (no reference checkpoint is needed)."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

import candle_nn as cn
from conftest import rel_err
from candle_nn_models.segment_anything import ImageEncoderViT, Sam, ViTConfig
from candle_nn_models.segment_anything.image_encoder import resize_rel_pos

SMALL = ViTConfig(embed_dim=32, depth=3, num_heads=4, global_attn_indexes=(1,), img_size=80,
                  patch_size=16, window_size=3, out_chans=16)  # 5x5 grid: windows need padding

erf = np.vectorize(math.erf)


def layer_norm(x, w, b, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def reference_attention(t, p, x, heads):
    b, h, w, c = x.shape
    hd = c // heads
    qkv = (x.reshape(b, h * w, c) @ t[p + "qkv.weight"].T + t[p + "qkv.bias"])
    qkv = qkv.reshape(b, h * w, 3, heads, hd).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv.reshape(3, b * heads, h * w, hd)
    attn = (q * hd ** -0.5) @ k.transpose(0, 2, 1)
    rh = t[p + "rel_pos_h"][np.arange(h)[:, None] - np.arange(h)[None, :] + h - 1]
    rw = t[p + "rel_pos_w"][np.arange(w)[:, None] - np.arange(w)[None, :] + w - 1]
    r_q = q.reshape(b * heads, h, w, hd)
    rel_h = np.einsum("bhwc,hkc->bhwk", r_q, rh)
    rel_w = np.einsum("bhwc,wkc->bhwk", r_q, rw)
    attn = (attn.reshape(b * heads, h, w, h, w) + rel_h[:, :, :, :, None]
            + rel_w[:, :, :, None, :]).reshape(b * heads, h * w, h * w)
    out = (softmax(attn) @ v).reshape(b, heads, h, w, hd).transpose(0, 2, 3, 1, 4)
    return out.reshape(b, h, w, c) @ t[p + "proj.weight"].T + t[p + "proj.bias"]


def reference_encoder(t, x, cfg: ViTConfig):
    """SAM's ImageEncoderViT.forward, float64, NHWC input ``x``."""
    g, ps = cfg.img_size // cfg.patch_size, cfg.patch_size
    b = x.shape[0]
    patches = x.reshape(b, g, ps, g, ps, 3)
    x = np.einsum("bipjqc,ocpq->bijo", patches, t["patch_embed.proj.weight"])
    x = x + t["patch_embed.proj.bias"] + t["pos_embed"]
    for i in range(cfg.depth):
        p = f"blocks.{i}."
        y = layer_norm(x, t[p + "norm1.weight"], t[p + "norm1.bias"])
        if i in cfg.global_attn_indexes:
            y = reference_attention(t, p + "attn.", y, cfg.num_heads)
        else:
            ws = cfg.window_size
            pad = -g % ws
            yp = np.pad(y, [(0, 0), (0, pad), (0, pad), (0, 0)])
            n = (g + pad) // ws
            c = yp.shape[-1]
            win = yp.reshape(b, n, ws, n, ws, c).transpose(0, 1, 3, 2, 4, 5).reshape(-1, ws, ws, c)
            win = reference_attention(t, p + "attn.", win, cfg.num_heads)
            yp = win.reshape(b, n, n, ws, ws, c).transpose(0, 1, 3, 2, 4, 5)
            y = yp.reshape(b, g + pad, g + pad, c)[:, :g, :g]
        x = x + y
        z = layer_norm(x, t[p + "norm2.weight"], t[p + "norm2.bias"])
        z = z @ t[p + "mlp.lin1.weight"].T + t[p + "mlp.lin1.bias"]
        z = 0.5 * z * (1 + erf(z / math.sqrt(2)))
        x = x + z @ t[p + "mlp.lin2.weight"].T + t[p + "mlp.lin2.bias"]
    x = np.einsum("bhwc,oc->bhwo", x, t["neck.0.weight"][:, :, 0, 0])
    x = layer_norm(x, t["neck.1.weight"], t["neck.1.bias"])
    xp = np.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)])
    w = t["neck.2.weight"]
    x = sum(np.einsum("bhwc,oc->bhwo", xp[:, dy:dy + g, dx:dx + g], w[:, :, dy, dx])
            for dy in range(3) for dx in range(3))
    return layer_norm(x, t["neck.3.weight"], t["neck.3.bias"])


@pytest.fixture(scope="module")
def small_weights():
    """Every tensor of the small encoder, random (also LayerNorms, rel-pos tables, pos_embed)."""
    varmap = cn.VarMap()
    ImageEncoderViT.load(cn.VarBuilder.from_varmap(varmap, device="cpu"), SMALL)
    rng = np.random.default_rng(0)
    return {name: (rng.normal(size=v.shape) * 0.2).astype(np.float32)
            for name, v in varmap.all_vars().items()}


def test_vit_encoder_matches_numpy_reference(small_weights, device):
    size = SMALL.img_size
    x = np.random.default_rng(1).normal(size=(2, size, size, 3)).astype(np.float32)
    encoder = ImageEncoderViT.load(cn.VarBuilder.from_tensors(small_weights, device=device), SMALL)
    y = np.array(encoder(mx.array(x)))
    ref = reference_encoder({k: v.astype(np.float64) for k, v in small_weights.items()},
                            x.astype(np.float64), SMALL)
    assert y.shape == (2, 5, 5, SMALL.out_chans)
    assert rel_err(y, ref) < 1e-5  # float32 vs float64: ~4e-7; dropping rel-pos: ~5e-3


def test_rel_pos_table_resize_is_linear_interpolation():
    """Tables of another length are resampled like F.interpolate(mode="linear")."""
    table = np.arange(10, dtype=np.float32).reshape(5, 2)
    out = np.array(resize_rel_pos(mx.array(table), 9))
    src = np.maximum((np.arange(9) + 0.5) * 5 / 9 - 0.5, 0)
    expected = np.stack([np.interp(src, np.arange(5), table[:, j]) for j in range(2)], axis=1)
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_vit_b_tensor_names_and_shapes():
    """ViT-B reads candle's names: windowed blocks have 27-row rel-pos tables, global ones 127."""
    vb = cn.VarBuilder.from_varmap(cn.VarMap(), device="cpu")
    sam = Sam.load(vb, "vit_b")
    names = vb.accessed()
    assert "image_encoder.pos_embed" in names and "image_encoder.patch_embed.proj.weight" in names
    assert vb.shape("image_encoder.blocks.0.attn.rel_pos_h") == (27, 64)
    assert vb.shape("image_encoder.blocks.2.attn.rel_pos_w") == (127, 64)
    assert vb.shape("image_encoder.blocks.11.mlp.lin1.weight") == (3072, 768)
    assert len(sam.image_encoder.blocks) == 12
    assert {n.split(".")[0] for n in names} == {"image_encoder", "prompt_encoder", "mask_decoder"}
