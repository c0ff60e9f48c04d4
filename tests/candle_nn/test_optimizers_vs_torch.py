"""mlx.optimizers against torch.optim on the same gradients (float64 reference): the settings
docs/training.md gives reproduce PyTorch's update rules step for step, and the differences it
names are real (MLX's Adam/AdamW default to no bias correction; SGD's dampening is applied from
the first step, PyTorch's from the second)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import candle_nn  # noqa: F401  (import-time policy before mlx)
import mlx.core as mx
import mlx.optimizers as optim

STEPS = 4


def run(mlx_opt: optim.Optimizer, torch_cls, **torch_kwargs) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(0)
    start = r.standard_normal(6)
    grads = [r.standard_normal(6) for _ in range(STEPS)]
    params = {"w": mx.array(start, dtype=mx.float32)}
    for g in grads:
        params = mlx_opt.apply_gradients({"w": mx.array(g, dtype=mx.float32)}, params)
    w = torch.tensor(start, requires_grad=True)
    opt = torch_cls([w], **torch_kwargs)
    for g in grads:
        w.grad = torch.tensor(g)
        opt.step()
    return np.array(params["w"]), w.detach().numpy()


def close(a, b) -> bool:
    return float(np.abs(a - b).max() / np.abs(b).max()) < 1e-6


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_momentum_weight_decay_is_pytorchs(nesterov):
    ours, ref = run(optim.SGD(learning_rate=0.1, momentum=0.9, weight_decay=1e-2,
                              nesterov=nesterov),
                    torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=1e-2, nesterov=nesterov)
    assert close(ours, ref)


def test_sgd_dampening_differs_on_the_first_step():
    ours, ref = run(optim.SGD(learning_rate=0.1, momentum=0.9, dampening=0.5),
                    torch.optim.SGD, lr=0.1, momentum=0.9, dampening=0.5)
    assert not close(ours, ref)


@pytest.mark.parametrize("cls,torch_cls", [(optim.AdamW, torch.optim.AdamW),
                                           (optim.Adam, torch.optim.Adam)])
def test_adam_needs_bias_correction(cls, torch_cls):
    kwargs = dict(betas=[0.9, 0.999], eps=1e-8)
    wd = {"weight_decay": 0.05} if cls is optim.AdamW else {}
    ours, ref = run(cls(learning_rate=1e-2, bias_correction=True, **kwargs, **wd), torch_cls,
                    lr=1e-2, betas=(0.9, 0.999), eps=1e-8, **wd)
    assert close(ours, ref)
    default, _ = run(cls(learning_rate=1e-2, **kwargs, **wd), torch_cls, lr=1e-2)
    assert not close(default, ref)
