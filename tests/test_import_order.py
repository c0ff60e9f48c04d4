"""Importing any module of the project first still applies candle_nn's import-time policy
(candle_nn/_startup.py) before MLX loads, so MLX gets the fast CPU BLAS. Every module of
candle_nn_models (models/, weights/, scripts/) and of the benchmark harness is imported first in a
fresh interpreter; none may leave MLX on its reference BLAS."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import ROOT

# folder -> the package it is imported as
PACKAGES = {"models": "candle_nn_models", "weights": "candle_nn_models.weights",
            "scripts": "candle_nn_models.scripts", "benchmarks": "benchmarks"}
PROBE = ("import {module}, json, sys; import candle_nn.blas as b; s = b.status(); "
         "print(json.dumps([s.state, s.detail, 'mlx.core' in sys.modules]))")


def _modules() -> list[str]:
    names = []
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__main__":
                continue  # runs the program
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join((package, *parts)))
    return names


def _probe(module: str) -> list:
    """``[BLAS state, detail, whether MLX was imported]`` after importing ``module`` first, or
    ``["error", stderr's last line, None]`` (``-W error``: candle_nn's warning that it came after
    mlx, or any other warning at import, is an error)."""
    proc = subprocess.run([sys.executable, "-W", "error", "-c", PROBE.format(module=module)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    if proc.returncode != 0:
        return ["error", (proc.stderr.strip().splitlines() or [""])[-1], None]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_modules_list_is_the_project() -> None:
    modules = _modules()
    assert {"candle_nn_models.resnet", "candle_nn_models.segment_anything.amg.masks",
            "candle_nn_models.weights.spec", "candle_nn_models.scripts.resnet",
            "benchmarks.bench"} <= set(modules), modules


def test_every_module_imported_first_gets_the_import_time_policy() -> None:
    expected = _probe("candle_nn")
    with ThreadPoolExecutor(max_workers=3) as pool:
        states = dict(zip(_modules(), pool.map(_probe, _modules())))
    late = sorted(m for m, s in states.items() if "imported before candle_nn" in s[1])
    assert not late, f"these import mlx before candle_nn (see candle_nn/_startup.py): {late}"
    assert {m: s for m, s in states.items() if s[0] != expected[0]} == {}
    assert states["candle_nn_models.resnet"][2], "the probe really imports MLX"


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
