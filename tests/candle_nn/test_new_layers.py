"""candle-nn's layers added for training — Conv1d, ConvTranspose1d, GroupNorm, Dropout: what the
gradient matrix (test_core_grads.py, forward and gradients against torch) does not cover: the
checkpoint round trip in candle's layouts, shape checks, and Dropout's train/eval behaviour."""

from __future__ import annotations

import numpy as np
import pytest

import candle_nn as cn
import mlx.core as mx


def test_conv1d_layers_save_in_pytorch_layout(tmp_path):
    r = np.random.default_rng(0)
    tensors = {"a.weight": r.standard_normal((6, 2, 3)).astype(np.float32),
               "a.bias": r.standard_normal(6).astype(np.float32),
               "b.weight": r.standard_normal((6, 2, 5)).astype(np.float32),
               "b.bias": r.standard_normal(4).astype(np.float32),
               "c.weight": r.standard_normal(4).astype(np.float32),
               "c.bias": r.standard_normal(4).astype(np.float32)}
    vb = cn.VarBuilder.from_tensors(tensors)
    model = cn.seq([cn.Conv1d.load(vb.pp("a"), 4, 6, 3, cn.Conv1dConfig(groups=2)),
                    cn.ConvTranspose1d.load(vb.pp("b"), 6, 4, 5,
                                            cn.ConvTranspose1dConfig(stride=2, groups=2)),
                    cn.GroupNorm.load(vb.pp("c"), 2, 4)])
    saved = cn.state_dict(model)
    assert set(saved) == set(tensors)
    for k, v in tensors.items():
        assert np.array_equal(np.array(saved[k]), v), k
    x = mx.array(r.standard_normal((2, 9, 4)).astype(np.float32))
    path = tmp_path / "m.safetensors"
    cn.save_safetensors(model, path)
    vb2 = cn.VarBuilder.from_safetensors(path)
    again = cn.seq([cn.Conv1d.load(vb2.pp("a"), 4, 6, 3, cn.Conv1dConfig(groups=2)),
                    cn.ConvTranspose1d.load(vb2.pp("b"), 6, 4, 5,
                                            cn.ConvTranspose1dConfig(stride=2, groups=2)),
                    cn.GroupNorm.load(vb2.pp("c"), 2, 4)])
    assert np.array_equal(np.array(model(x)), np.array(again(x)))


def test_shape_checks():
    vb = cn.VarBuilder.from_varmap(cn.VarMap(), seed=0)
    with pytest.raises(cn.ShapeMismatchError, match="groups"):
        cn.Conv1d.load(vb.pp("a"), 5, 4, 3, cn.Conv1dConfig(groups=2))
    with pytest.raises(cn.ShapeMismatchError, match="groups"):
        cn.GroupNorm.load(vb.pp("g"), 3, 8)
    with pytest.raises(ValueError, match="probability"):
        cn.Dropout(1.0)


def test_dropout_trains_seeded_and_is_the_identity_in_eval():
    x = mx.ones((200, 50))
    drop = cn.Dropout(0.25)
    assert drop.training  # as every MLX module, built in train mode
    mx.random.seed(7)
    a = np.array(drop(x))
    mx.random.seed(7)
    b = np.array(drop(x))
    assert np.array_equal(a, b)  # seeded
    assert set(np.unique(a)) == {0.0, np.float32(1 / 0.75)}
    assert abs((a == 0).mean() - 0.25) < 0.02  # 10,000 draws: 0.25 +- 4.6 sigma
    assert not np.array_equal(a, np.array(drop(x)))  # a new mask per call
    mx.random.seed(7)
    grad = np.array(mx.grad(lambda x: drop(x).sum())(x))
    assert np.array_equal(grad, a)  # d/dx of x * mask / (1 - p) is the scaled mask
    drop.eval()
    assert np.array_equal(np.array(drop(x)), np.array(x))
