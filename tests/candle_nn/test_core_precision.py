"""Float32 precision policy: importing candle_nn makes float32 exact on every backend (MLX's CUDA
backend would otherwise use TF32) unless the user opts in; the env handling is checked in fresh
subprocesses, the numerics on every available device."""

from __future__ import annotations

import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from conftest import ROOT, rel_err

import candle_nn as cn

REPORT = ("import os, candle_nn; "
          "print(os.environ.get('MLX_ENABLE_TF32'), candle_nn.float32_precision())")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MLX_ENABLE_TF32", "CANDLE_NN_PRECISION")}
    clean.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env=clean, timeout=120)


@pytest.mark.parametrize("env, expected", [
    ({}, "0 exact"),
    ({"CANDLE_NN_PRECISION": "exact"}, "0 exact"),
    ({"CANDLE_NN_PRECISION": "tf32"}, "1 tf32"),
    ({"CANDLE_NN_PRECISION": " TF32 "}, "1 tf32"),
    ({"MLX_ENABLE_TF32": "1"}, "1 tf32"),  # an explicit MLX setting is respected...
    ({"MLX_ENABLE_TF32": "0", "CANDLE_NN_PRECISION": "tf32"}, "0 exact"),  # ...whichever way
    ({"MLX_ENABLE_TF32": "1", "CANDLE_NN_PRECISION": "exact"}, "1 tf32"),
], ids=["default", "exact", "tf32", "tf32_spaced", "mlx_1", "mlx_0_wins", "mlx_1_wins"])
def test_import_sets_the_mlx_switch(env, expected):
    out = run_python(REPORT, **env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_unknown_precision_fails_at_import():
    out = run_python("import candle_nn", CANDLE_NN_PRECISION="fp8")
    assert out.returncode != 0
    assert "CANDLE_NN_PRECISION='fp8'" in out.stderr and "'exact' or 'tf32'" in out.stderr


def test_switch_is_set_before_mlx_is_imported():
    """MLX reads MLX_ENABLE_TF32 when its backend initialises: the variable must already be set
    when ``import candle_nn`` first imports mlx.core."""
    code = """
import importlib.abc, os, sys
seen = []
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "mlx.core":
            seen.append(os.environ.get("MLX_ENABLE_TF32"))
        return None
sys.meta_path.insert(0, Watch())
import candle_nn
print(seen[:1])
"""
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['0']"


def test_set_float32_precision():
    code = ("import candle_nn as cn\n"
            "cn.set_float32_precision('tf32'); a = cn.float32_precision()\n"
            "cn.set_float32_precision('exact'); b = cn.float32_precision()\n"
            "import os; print(a, b, os.environ['MLX_ENABLE_TF32'])\n"
            "try:\n    cn.set_float32_precision('fast')\nexcept ValueError as e: print(e)\n")
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "tf32 exact 0"
    assert "'exact' or 'tf32'" in lines[1] and "'fast'" in lines[1]


def test_this_process_is_exact():
    """The test session runs with the default policy: importing candle_nn set the switch."""
    assert os.environ.get("MLX_ENABLE_TF32") == "0", "run the tests without CANDLE_NN_PRECISION"
    assert cn.float32_precision() == "exact"


# -- numerics on every device --------------------------------------------------------------------
def test_float32_matmul_is_exact(device):
    """TF32 (10-bit mantissa) gives ~1e-3 here; true float32 ~1e-7."""
    if cn.float32_precision() != "exact":
        pytest.fail("the test session must run with exact float32 (unset CANDLE_NN_PRECISION)")
    r = np.random.default_rng(0)
    a = r.standard_normal((1024, 512)).astype(np.float32)
    b = r.standard_normal((512, 256)).astype(np.float32)
    with mx.stream(device.stream):
        c = mx.array(a) @ mx.array(b)
        mx.eval(c)
    err = rel_err(np.array(c), a.astype(np.float64) @ b.astype(np.float64))
    assert err <= 1e-5, f"{device}: float32 matmul rel err {err:.2e} (TF32?)"


def test_float32_conv_is_exact(device):
    r = np.random.default_rng(1)
    x = r.standard_normal((1, 32, 32, 64)).astype(np.float32)
    w = r.standard_normal((64, 64, 3, 3)).astype(np.float32)  # (O, I, kH, kW)
    conv = cn.Conv2d.load(cn.VarBuilder.from_tensors({"weight": w}, device=device), 64, 64, 3,
                          cn.Conv2dConfig(padding=1), bias=False)
    y = np.array(conv(mx.array(x)))
    xp = np.pad(x.astype(np.float64), [(0, 0), (1, 1), (1, 1), (0, 0)])
    ref = sum(xp[:, i:i + 32, j:j + 32, :] @ w[:, :, i, j].T.astype(np.float64)
              for i in range(3) for j in range(3))
    err = rel_err(y, ref)
    assert err <= 1e-5, f"{device}: float32 conv rel err {err:.2e} (TF32?)"
