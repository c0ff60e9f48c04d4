"""YOLOv8 built for training (``fold_bn=False``) against ultralytics in train mode
(``../shared/fixtures/yolov8n_loss``): ``model.train()(x)`` returns the head's raw per-level maps
(ultralytics' ``Detect`` train-mode output, NHWC), the neck maps feeding them match ``feats_p*``,
BatchNorm running statistics after the forward (momentum 0.03) match ``after.*``; ``eval()``
returns the decoded prediction of the folded model.
"""

from __future__ import annotations

import numpy as np
from conftest import assert_matches, load_fixture

import candle_nn as cn
import mlx.core as mx
from candle_nn.checkpoint import state_dict
from candle_nn_models.yolo_v8 import YoloV8


def rel_l2(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_train_mode_raw_outputs_and_running_stats():
    io, meta, folder = load_fixture("yolov8n_loss")
    vb = cn.VarBuilder.from_safetensors(folder / "weights.safetensors", device=cn.Device.cpu())
    model = YoloV8.load(vb, "n", 80, fold_bn=False)
    x = mx.array(io["input.image"].transpose(0, 2, 3, 1))
    folded = np.array(YoloV8.load(vb, "n", 80)(x))
    assert rel_l2(np.array(model(x)), folded) < 1e-5  # built in eval mode: the folded model's

    model.train()
    neck = model.fpn(*model.net(x))
    stats = {k: np.array(v) for k, v in state_dict(model).items()}  # after one forward
    for key in (k for k in io if k.startswith("output.after.")):
        name = key[len("output."):]
        assert_matches(meta, name, stats[name[len("after."):]], io[key])
    raw = model(x)
    assert [r.shape for r in raw] == [(2, 80, 80, 144), (2, 40, 40, 144), (2, 20, 20, 144)]
    for name, got in zip(("feats_p3", "feats_p4", "feats_p5"), neck):
        got = np.array(got).transpose(0, 3, 1, 2)
        assert_matches(meta, name, got, io[f"output.{name}"])
        assert rel_l2(got, io[f"output.{name}"]) <= meta["tolerance"][name]["rtol_l2"]
    flat = np.concatenate([np.array(r).reshape(2, -1, 144) for r in raw], axis=1)
    for name, got in (("boxes", flat[..., :64]), ("scores", flat[..., 64:])):
        assert_matches(meta, name, got.transpose(0, 2, 1), io[f"output.{name}"])

    model.eval()
    out = np.array(model(x))
    assert out.shape == folded.shape == (2, 84, 8400)


def test_trained_checkpoint_names_everything_and_reloads_folded(tmp_path):
    """After train-mode forwards (statistics moved), the saved file holds the weights file's
    names exactly, and reloads folded within 1e-5 of the model in eval mode."""
    _, _, folder = load_fixture("yolov8n_loss")
    weights = folder / "weights.safetensors"
    model = YoloV8.load(cn.VarBuilder.from_safetensors(weights), "n", 80, fold_bn=False).train()
    x = mx.array(np.random.default_rng(0).uniform(0, 1, (2, 128, 160, 3)).astype(np.float32))
    mx.eval(model(x), model.state)
    path = tmp_path / "trained.safetensors"
    saved = cn.save_safetensors(model.eval(), path)
    original = cn.VarBuilder.from_safetensors(weights)
    assert set(saved) == {n for n in original.names() if not n.endswith("num_batches_tracked")}
    reloaded = YoloV8.load(cn.VarBuilder.from_safetensors(path), "n", 80)
    want, got = np.array(model(x)), np.array(reloaded(x))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
