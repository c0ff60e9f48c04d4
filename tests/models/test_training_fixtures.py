"""ResNet-18 training against PyTorch (issue 23): ``../shared/fixtures/resnet18_train`` (train-mode
BatchNorm, cross-entropy, SGD lr 0.01 momentum 0.9 weight decay 1e-4) and
``resnet18_train_frozen_bn`` (BatchNorm statistics frozen, AdamW lr 1e-3, betas (0.9, 0.999),
eps 1e-8, weight decay 0.01), two steps each on one batch, with ``mlx.optimizers`` and
``mlx.nn.losses`` set up as docs/training.md says. Logits and losses within the fixtures'
``rtol_of_max_abs``; gradients, updated parameters and running statistics within ``rtol_l2``
(relative L2 error), as the fixtures' README asks.
"""

from __future__ import annotations

import numpy as np
from conftest import FIXTURES, assert_matches, load_fixture

import candle_nn as cn
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from candle_nn.checkpoint import state_dict
from candle_nn_models.resnet import ResNet


def rel_l2(candidate, reference) -> float:
    candidate = np.asarray(candidate, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    assert candidate.shape == reference.shape, (candidate.shape, reference.shape)
    return float(np.linalg.norm(candidate - reference) / np.linalg.norm(reference))


def assert_l2(meta: dict, key: str, candidate, reference) -> None:
    tol = meta["tolerance"][key]["rtol_l2"]
    err = rel_l2(candidate, reference)
    assert err <= tol, f"{key}: relative L2 error {err:.3e} > tolerance {tol:.1e}"


def loss_fn(model: ResNet, x: mx.array, labels: mx.array) -> mx.array:
    return nn.losses.cross_entropy(model(x), labels, reduction="mean")


def run_two_steps(name: str, optimizer: optim.Optimizer, freeze_stats: bool):
    """Train the fixture's ResNet-18 for two steps. Returns ``(io, meta, logits of the first
    forward, [loss1, loss2], first gradients, state after the steps)``, the last two under candle's
    names in PyTorch's layout (``candle_nn.checkpoint.state_dict``)."""
    io, meta, _ = load_fixture(name)
    weights = FIXTURES / "resnet18" / "weights.safetensors"
    model = ResNet.load(cn.VarBuilder.from_safetensors(weights, device=cn.Device.cpu()),
                        "resnet18", 1000, fold_bn=False).train()
    if freeze_stats:
        cn.freeze_bn_stats(model)
    x = mx.array(io["input.image"].transpose(0, 2, 3, 1))
    labels = mx.array(io["input.labels"].astype(np.int32))
    start = model.parameters()
    logits = np.array(model(x))
    model.update(start)  # that forward updated the running statistics
    loss_and_grad = nn.value_and_grad(model, loss_fn)
    losses, grads = [], {}
    for step in range(2):
        loss, g = loss_and_grad(model, x, labels)
        if step == 0:  # name the gradients as the weights: put them in the model for a moment
            mx.eval(g)
            before = model.parameters()
            model.update(g)
            grads = {k: np.array(v) for k, v in state_dict(model).items()}
            model.update(before)
        optimizer.update(model, g)
        mx.eval(loss, model.state, optimizer.state)
        losses.append(float(loss))
    after = {k: np.array(v) for k, v in state_dict(model).items()}
    return io, meta, logits, losses, grads, after


def check(io, meta, logits, losses, grads, after) -> None:
    assert_matches(meta, "logits_step1", logits, io["output.logits_step1"])
    assert_matches(meta, "loss_step1", [losses[0]], io["output.loss_step1"])
    assert_matches(meta, "loss_step2", [losses[1]], io["output.loss_step2"])
    checked = 0
    for key in meta["tolerance"]:
        kind, _, name = key.partition(".")
        if kind in ("grad_step1", "after_step2"):
            got = (grads if kind == "grad_step1" else after)[name]
            assert_l2(meta, key, got, io[f"output.{key}"])
            checked += 1
    assert checked >= 10


def test_resnet18_train_mode_bn_sgd():
    sgd = optim.SGD(learning_rate=0.01, momentum=0.9, weight_decay=1e-4)
    check(*run_two_steps("resnet18_train", sgd, freeze_stats=False))


def test_resnet18_frozen_bn_adamw():
    adamw = optim.AdamW(learning_rate=1e-3, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01,
                        bias_correction=True)
    check(*run_two_steps("resnet18_train_frozen_bn", adamw, freeze_stats=True))

