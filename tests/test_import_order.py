"""Importing any of the project's packages first still gets the fast CPU BLAS: each imports
candle_nn (which preloads the BLAS) before anything imports MLX."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

PROBE = "import {module}; import candle_nn.blas as b; print(b.status().state)"


def _state(module: str) -> str:
    proc = subprocess.run([sys.executable, "-W", "error", "-c", PROBE.format(module=module)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


@pytest.mark.parametrize("module", [
    "candle_nn_models.resnet", "candle_nn_models.yolo_v8", "candle_nn_models.segment_anything",
    "candle_nn_models.weights.convert", "candle_nn_models.scripts.resnet",
    "candle_nn_models.scripts.yolo_v8", "candle_nn_models.scripts.segment_anything",
    "candle_nn_models.scripts.common", "candle_nn_models.scripts.batch",
    "candle_nn_models.scripts.batch_models", "candle_nn_models.scripts.batch_pipeline"])
def test_entry_modules_import_candle_nn_before_mlx(module):
    assert _state(module) == _state("candle_nn")


LAYERS = ("import {module}, json, sys; print(json.dumps(sorted(sys.modules)))")
MODELS = "candle_nn_models"
WEIGHTS, SCRIPTS = f"{MODELS}.weights", f"{MODELS}.scripts"


def _below(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("module, above", [("candle_nn.cli", (MODELS, WEIGHTS, SCRIPTS)),
                                           (f"{MODELS}.segment_anything", (WEIGHTS, SCRIPTS)),
                                           (f"{WEIGHTS}.cli", (SCRIPTS,))])
def test_imports_go_one_way_candle_nn_models_weights_scripts(module, above):
    proc = subprocess.run([sys.executable, "-c", LAYERS.format(module=module)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = json.loads(proc.stdout)
    assert not [m for m in loaded for pkg in above if _below(m, pkg)], loaded
