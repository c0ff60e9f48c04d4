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


@pytest.mark.parametrize("module", ["models.resnet", "models.yolo_v8", "models.segment_anything",
                                    "weights.convert", "scripts.resnet", "scripts.yolo_v8",
                                    "scripts.segment_anything", "scripts.common",
                                    "scripts.batch", "scripts.batch_models",
                                    "scripts.batch_pipeline"])
def test_entry_modules_import_candle_nn_before_mlx(module):
    assert _state(module) == _state("candle_nn")


LAYERS = ("import {module}, json, sys; "
          "print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))")


@pytest.mark.parametrize("module, above", [("candle_nn.cli", {"models", "weights", "scripts"}),
                                           ("models.segment_anything", {"weights", "scripts"}),
                                           ("weights.cli", {"scripts"})])
def test_imports_go_one_way_candle_nn_models_weights_scripts(module, above):
    proc = subprocess.run([sys.executable, "-c", LAYERS.format(module=module)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not above & set(json.loads(proc.stdout)), proc.stdout
