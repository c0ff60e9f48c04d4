"""``Module.set_compiled``: the ``mx.compile`` inference path (the CLIs' ``--compile``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import numpy as np
import pytest

import candle_nn as cn
from candle_nn_models.resnet import ResNet
from candle_nn_models.scripts.common import compile_choice


def _resnet18(device: cn.Device) -> ResNet:
    return ResNet.load(cn.VarBuilder.from_varmap(cn.VarMap(), seed=0, device=device), "resnet18")


def test_compiled_forward_matches_eager(device):
    model = _resnet18(device)
    x = mx.array(np.random.default_rng(0).random((2, 64, 64, 3), dtype=np.float32))
    eager = np.array(model(x))
    assert model.set_compiled(True) is model
    compiled = np.array(model(x))
    assert np.abs(compiled - eager).max() <= 1e-5 * np.abs(eager).max()
    model.set_compiled(False)
    assert np.array_equal(np.array(model(x)), eager)


def test_compiled_forward_runs_in_other_threads(device):
    model = _resnet18(device)
    x = mx.array(np.random.default_rng(1).random((1, 64, 64, 3), dtype=np.float32))
    mx.eval(x)
    eager = np.array(model(x))
    model.set_compiled(True)
    results = []
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: np.array(model(x)), range(2)))
    for got in results:
        assert np.abs(got - eager).max() <= 1e-5 * np.abs(eager).max()


def test_auto_compiles_on_gpus_only(device):
    model = _resnet18(device).set_compiled(None)
    assert model.compiled == (device.kind == "gpu")


def test_moving_a_model_drops_its_compiled_forward():
    model = _resnet18(cn.Device.cpu()).set_compiled(True)
    model.to("cpu")
    assert not model.compiled


@pytest.mark.parametrize("choice,expected", [("auto", None), ("on", True), ("off", False)])
def test_cli_compile_choice(choice, expected):
    assert compile_choice(choice) is expected
