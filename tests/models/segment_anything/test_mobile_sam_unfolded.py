"""MobileSAM's TinyViT built for training (``fold_bn=False``): in eval mode it computes what the
folded encoder does; in train mode its BatchNorms learn (batch statistics, running statistics
updated) and its checkpoint keeps every statistic under MobileSAM's names."""

from __future__ import annotations

import numpy as np
from conftest import fixture_dir

import candle_nn as cn
import mlx.core as mx
import mlx.nn as nn
from candle_nn_models.segment_anything import Sam


def test_unfolded_tiny_vit_matches_folded_and_trains():
    weights = fixture_dir("mobile_sam") / "weights.safetensors"
    vb = cn.VarBuilder.from_safetensors(weights)
    folded = Sam.load(vb).image_encoder
    sam = Sam.load(vb, fold_bn=False)
    encoder = sam.image_encoder
    x = mx.array(np.random.default_rng(0).uniform(-2, 2, (1, 256, 256, 3)).astype(np.float32))
    want, got = np.array(folded(x)), np.array(encoder(x))
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()

    names = cn.state_dict(encoder)
    key = "image_encoder.patch_embed.seq.0.bn.running_mean"
    assert key in names and "image_encoder.layers.1.blocks.0.local_conv.bn.running_var" in names
    before = np.array(names[key])
    encoder.train()
    grads = nn.value_and_grad(encoder, lambda m, x: m(x).square().mean())(encoder, x)[1]
    g = grads["patch_embed"]["conv1"]["bn"]
    mx.eval(g, encoder.state)
    assert set(g) == {"weight", "bias"} and np.abs(np.array(g["weight"])).max() > 0
    assert not np.array_equal(np.array(cn.state_dict(encoder)[key]), before)
