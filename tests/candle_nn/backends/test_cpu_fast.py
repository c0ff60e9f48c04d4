"""The pure-MLX CPU implementations (backends/cpu/): each equals the plain MLX op it replaces
(stated tolerance),
one switch turns them all off, and they are never taken off the CPU."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from conftest import ROOT

import candle_nn as cn
from candle_nn.backends.cpu.depthwise import shifted
from candle_nn.backends.cpu.kernels import float32_cpu
from candle_nn.backends.cpu.silu_poly import silu_f32


@pytest.fixture
def fast_off():
    """Run a block with the CPU implementations off (the registry's switch)."""
    with cn.ops.disabled("cpu"):
        yield


def test_the_environment_switch_turns_every_path_off() -> None:
    # The CPU is made the default device in the child: on a GPU machine it would not be.
    code = ("import candle_nn as cn; "
            "print(*(r['enabled'] for r in cn.ops.status() if r['backend'] == 'cpu'))")
    env = {k: v for k, v in os.environ.items() if k != "CANDLE_NN_CPU_FAST"}
    rows = sum(r["backend"] == "cpu" for r in cn.ops.status())
    for value, expected in (("0", "False " * rows), ("1", "True " * rows)):
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                              text=True, timeout=120, env={**env, "CANDLE_NN_CPU_FAST": value})
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == expected.split()


def test_paths_apply_only_to_float32_on_the_cpu(device) -> None:
    with mx.stream(device.stream):
        on_cpu = device.kind == "cpu"
        assert float32_cpu(mx.float32) is on_cpu
        assert float32_cpu(mx.float16) is False


def test_switch_off_gives_the_plain_ops(fast_off) -> None:
    with mx.stream(mx.cpu):
        assert not cn.ops.is_enabled("cpu")
        x = mx.array(np.linspace(-20, 20, 1001, dtype=np.float32))
        assert mx.array_equal(cn.silu(x), x * mx.sigmoid(x)).item()
        plain_gelu = x * (1.0 + mx.erf(x / math.sqrt(2.0))) * 0.5  # the same switch for GELU
        assert mx.array_equal(cn.gelu(x), plain_gelu).item()


def test_silu_matches_the_plain_op() -> None:
    """Fast SiLU vs MLX's ``x * sigmoid(x)``: within 1e-6 relative (both vs float64 in
    test_core_ops' sweep)."""
    with mx.stream(mx.cpu):
        x = mx.array(np.random.default_rng(0).normal(0, 6, (3, 17, 19, 8)).astype(np.float32))
        fast, plain = np.array(silu_f32(x)), np.array(x * mx.sigmoid(x))
    assert np.allclose(fast, plain, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kernel,stride,padding,hw", [
    ((3, 3), (1, 1), (1, 1), (9, 9)), ((3, 3), (2, 2), (1, 1), (10, 7)),
    ((5, 5), (1, 1), (2, 2), (8, 8)), ((3, 5), (2, 1), (1, 2), (9, 11)),
    ((3, 3), (1, 1), (0, 0), (6, 6)),
])
def test_depthwise_matches_mlx_grouped_conv(kernel, stride, padding, hw) -> None:
    """Shifted multiply-adds vs ``mx.conv2d(groups=C)``: within 1e-5 of the output's max."""
    rng = np.random.default_rng(sum(kernel) + sum(hw))
    c = 12
    x = mx.array(rng.standard_normal((2, *hw, c), dtype=np.float32))
    w = mx.array(rng.standard_normal((c, *kernel, 1), dtype=np.float32))
    with mx.stream(mx.cpu):
        fast = np.array(shifted(*kernel, stride, padding)(x, w))
        plain = np.array(mx.conv2d(x, w, stride=stride, padding=padding, groups=c))
    assert fast.shape == plain.shape
    assert np.abs(fast - plain).max() <= 1e-5 * np.abs(plain).max()


def test_conv2d_takes_the_depthwise_path_only_when_on() -> None:
    """The module gives the same values with the switch off (plain MLX grouped conv)."""
    rng = np.random.default_rng(1)
    vb = cn.VarBuilder.from_tensors({"weight": rng.standard_normal((8, 1, 3, 3), dtype=np.float32)},
                                    device=cn.Device.cpu())
    conv = cn.Conv2d.load(vb, 8, 8, 3, cn.Conv2dConfig(padding=1, groups=8), bias=False)
    x = mx.array(rng.standard_normal((1, 7, 7, 8), dtype=np.float32))
    with cn.ops.disabled("cpu"):
        plain = np.array(conv(x))
    fast = np.array(conv(x))
    assert np.abs(fast - plain).max() <= 1e-5 * np.abs(plain).max()
