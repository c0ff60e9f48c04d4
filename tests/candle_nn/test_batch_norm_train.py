"""BatchNorm2d in train mode against PyTorch's (float64), its frozen running statistics, and a
model built with ``fold_bn=False``: freeze/unfreeze, ``mx.compile`` with the state as input and
output, and the trained model's checkpoint reloading folded for inference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import candle_nn as cn
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from candle_nn_models.resnet import ResNet


def bn_and_torch(device: cn.Device, c: int = 5, momentum: float = 0.1, eps: float = 1e-5):
    r = np.random.default_rng(0)
    t = {"running_mean": r.standard_normal(c), "running_var": r.uniform(0.5, 2, c),
         "weight": r.standard_normal(c), "bias": r.standard_normal(c)}
    vb = cn.VarBuilder.from_tensors({k: v.astype(np.float32) for k, v in t.items()},
                                    device=device)
    ours = cn.BatchNorm2d.load(vb, c, eps, momentum)
    ref = torch.nn.BatchNorm2d(c, eps=eps, momentum=momentum).double()
    with torch.no_grad():
        for k, v in t.items():
            getattr(ref, k).copy_(torch.tensor(v))
    return ours, ref


@pytest.mark.parametrize("momentum", [0.1, 0.03])
def test_train_mode_matches_pytorch_output_grads_and_running_stats(device, momentum):
    ours, ref = bn_and_torch(device, momentum=momentum)
    x = np.random.default_rng(1).standard_normal((3, 4, 6, 5)) * 3 + 1
    upstream = np.random.default_rng(2).standard_normal(x.shape)
    ours.train()
    ref.train()
    xt = torch.tensor(x.transpose(0, 3, 1, 2), requires_grad=True)
    yt = ref(xt)
    (yt * torch.tensor(upstream.transpose(0, 3, 1, 2))).sum().backward()

    def loss(params, xin):
        ours.update(params)
        return (ours(xin) * mx.array(upstream, dtype=mx.float32)).sum()

    xm = mx.array(x, dtype=mx.float32)
    with mx.stream(device.stream):
        gp, gx = mx.grad(loss, argnums=(0, 1))(ours.trainable_parameters(), xm)
        y = ours(xm)
        mx.eval(gp, gx, y, ours.state)
    assert set(gp) == {"weight", "bias"}  # running statistics are not trainable
    tol = 1e-5

    def close(got, want):
        got, want = np.array(got, np.float64), want.detach().numpy()
        assert np.abs(got - want).max() <= tol * np.abs(want).max()

    close(np.array(y).transpose(0, 3, 1, 2), yt)
    close(np.array(gx).transpose(0, 3, 1, 2), xt.grad)
    close(gp["weight"], ref.weight.grad)
    close(gp["bias"], ref.bias.grad)
    # the forward in mx.grad and the one after it: two updates, as PyTorch's two forwards
    ref(xt)
    close(ours.running_mean, ref.running_mean)
    close(ours.running_var, ref.running_var)
    ours.eval()
    ref.eval()
    close(np.array(ours(xm)).transpose(0, 3, 1, 2), ref(xt))


def test_constant_regions_keep_statistics_and_gradients_float32_exact(device):
    """A batch that is mostly one value per channel (letterbox padding through a conv): each
    row of it adds the same rounding error to a single running sum (2e-4 of the mean at
    19200 rows); the statistics, output and gradients stay within 1e-5 of float64 PyTorch."""
    c = 8
    ours, ref = bn_and_torch(device, c=c, momentum=1.0, eps=1e-3)
    r = np.random.default_rng(3)
    x = np.broadcast_to(r.uniform(-1, 1, c) * 0.3405 + 0.25, (3, 80, 80, c)).copy()
    x[0, 30:50] = r.standard_normal((20, 80, c))  # one band of content
    x = x.astype(np.float32).astype(np.float64)
    upstream = r.standard_normal(x.shape)
    xt = torch.tensor(x.transpose(0, 3, 1, 2), requires_grad=True)
    ours.train()
    ref.train()
    (ref(xt) * torch.tensor(upstream.transpose(0, 3, 1, 2))).sum().backward()

    def loss(params, xin):
        ours.update(params)
        return (ours(xin) * mx.array(upstream, dtype=mx.float32)).sum()

    grad = mx.grad(loss, argnums=(0, 1))
    with mx.stream(device.stream):
        gp, gx = grad(ours.trainable_parameters(), mx.array(x, dtype=mx.float32))
        y = ours(mx.array(x, dtype=mx.float32))
        mx.eval(gp, gx, y, ours.state)

    def close(got, want):
        got, want = np.array(got, np.float64), want.detach().numpy()
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err <= 1e-5, err

    close(ours.running_mean, ref.running_mean)  # momentum 1: the last batch's statistics
    close(ours.running_var, ref.running_var)
    close(np.array(y).transpose(0, 3, 1, 2), ref(xt))
    close(np.array(gx).transpose(0, 3, 1, 2), xt.grad)
    close(gp["weight"], ref.weight.grad)
    close(gp["bias"], ref.bias.grad)


def test_frozen_stats_use_running_statistics_in_train_mode(device):
    ours, ref = bn_and_torch(device)
    before = np.array(ours.running_mean)
    x = mx.array(np.random.default_rng(3).standard_normal((2, 3, 3, 5)), dtype=mx.float32)
    model = cn.seq([ours]).train()
    cn.freeze_bn_stats(model)
    ref.eval()
    y = np.array(model(x))
    want = ref(torch.tensor(np.array(x).transpose(0, 3, 1, 2), dtype=torch.float64))
    assert np.abs(y.transpose(0, 3, 1, 2) - want.detach().numpy()).max() < 1e-5
    assert np.array_equal(np.array(ours.running_mean), before)
    model.train()  # train() does not undo it
    assert ours.stats_frozen and set(ours.trainable_parameters()) == {"weight", "bias"}
    cn.freeze_bn_stats(model, False)
    model(x)
    assert not np.array_equal(np.array(ours.running_mean), before)


def test_train_mode_needs_more_than_one_value_per_channel():
    ours, _ = bn_and_torch(cn.Device.cpu())
    with pytest.raises(ValueError, match="more than one value"):
        ours.train()(mx.ones((1, 1, 1, 5)))


def small_resnet(seed: int = 0) -> ResNet:
    vb = cn.VarBuilder.from_varmap(cn.VarMap(), seed=seed)
    return ResNet.load(vb, "resnet18", num_classes=3, fold_bn=False)


def test_freeze_unfreeze_on_a_model_keeps_statistics_frozen():
    model = small_resnet()
    trainable = {k for k, _ in nn.utils.tree_flatten(model.trainable_parameters())}
    assert trainable and not any("running" in k for k in trainable)
    assert any(k.endswith("bn.running_mean") for k, _ in nn.utils.tree_flatten(model.parameters()))
    model.freeze()
    assert not nn.utils.tree_flatten(model.trainable_parameters())
    model.unfreeze()
    assert {k for k, _ in nn.utils.tree_flatten(model.trainable_parameters())} == trainable
    model.freeze()
    model.fc.unfreeze()  # a frozen backbone, a learning head
    assert {k for k, _ in nn.utils.tree_flatten(model.trainable_parameters())} == {
        "fc.weight", "fc.bias"}


def test_compiled_step_updates_statistics_and_checkpoint_reloads_folded(tmp_path):
    """One SGD step under mx.compile (model and optimizer state as inputs and outputs) equals the
    eager step; the trained model's file reloads folded, within 1e-5 in eval mode."""
    x = mx.array(np.random.default_rng(4).standard_normal((2, 32, 32, 3)), dtype=mx.float32)
    y = mx.array([0, 2])

    def loss_fn(model, x, y):
        return nn.losses.cross_entropy(model(x), y, reduction="mean")

    results = []
    for compiled in (False, True):
        model = small_resnet().train()
        opt = optim.SGD(learning_rate=0.1, momentum=0.9)
        state = [model.state, opt.state]

        def step(x, y):
            loss, grads = nn.value_and_grad(model, loss_fn)(model, x, y)
            opt.update(model, grads)
            return loss

        step = mx.compile(step, inputs=state, outputs=state) if compiled else step
        for _ in range(2):
            mx.eval(step(x, y), state)
        results.append(model)
    eager, comp = results
    for (k, a), (_, b) in zip(nn.utils.tree_flatten(eager.parameters()),
                              nn.utils.tree_flatten(comp.parameters())):
        assert np.allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-5), k
    rm = np.array(comp.stem.bn.running_mean)
    assert np.abs(rm).max() > 0  # updated twice from zero

    path = tmp_path / "trained.safetensors"
    cn.save_safetensors(comp, path)
    comp.eval()
    reloaded = ResNet.load(cn.VarBuilder.from_safetensors(path), "resnet18", num_classes=3)
    want, got = np.array(comp(x)), np.array(reloaded(x))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    unfolded = ResNet.load(cn.VarBuilder.from_safetensors(path), "resnet18", num_classes=3,
                           fold_bn=False)
    assert np.array_equal(np.array(unfolded.stem.bn.running_mean), rm)


@pytest.mark.parametrize("shape", [(2, 80, 80, 64), (2, 40, 40, 128), (3, 33, 47, 17)])
def test_channel_sums_stay_float32_accurate_whatever_the_blas(device, shape):
    """Train-mode BatchNorm's batch statistics and gradient sums (``cn.ops.channel_sum``) on
    values far from zero (mean 10), against float64. A ones-vector product met this only where
    the BLAS blocks its sums: OpenBLAS's AVX-512 "small matrix" kernel (Zen 4) sums such shapes
    as one running total, 1.8e-6 to 4.2e-6 relative; the blocked sums are <= 3e-7."""
    a = (10 + np.random.default_rng(3).standard_normal(shape)).astype(np.float32)
    exact = a.astype(np.float64).reshape(-1, shape[-1]).sum(axis=0)
    x = mx.array(a)
    with mx.stream(device.stream):
        got = np.array(cn.ops.channel_sum(x), np.float64)
        mean = np.array(cn.ops.channel_mean(x), np.float64)
        grad = mx.grad(lambda v: (cn.ops.channel_sum(v) * mx.arange(shape[-1])).sum())(x)
    assert np.abs(got - exact).max() / np.abs(exact).max() < 1e-6
    np.testing.assert_allclose(mean, exact / (a.size // shape[-1]), rtol=1e-6)
    np.testing.assert_array_equal(np.array(grad), np.broadcast_to(np.arange(shape[-1]), shape))
