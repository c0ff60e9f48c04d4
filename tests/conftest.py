"""Shared test helpers: where the reference fixtures live, devices to test on (and two of them
for the mixing tests), the parity check, and the CLIs' one-error-line contract.

The fixtures are required: when ``../shared/fixtures`` (or ``$CANDLE_NN_FIXTURES``) is missing,
every test that needs them fails loudly rather than skipping.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import candle_nn as cn
from candle_nn import device as cn_device
from candle_nn.backends.cpu import kernels as cpu_kernels

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = cn.config.fixtures_dir(ROOT.parent / "shared" / "fixtures")


def fixture_dir(name: str) -> Path:
    """Folder of one reference fixture; fails the test when the fixtures are missing."""
    path = FIXTURES / name
    if not path.is_dir():
        pytest.fail(
            f"reference fixtures not found at {path}. Put the shared fixtures at "
            f"{FIXTURES} or set CANDLE_NN_FIXTURES.", pytrace=False)
    return path


def load_fixture(name: str) -> tuple[dict[str, np.ndarray], dict, Path]:
    """``(io arrays, meta.json, folder)`` of a fixture."""
    folder = fixture_dir(name)
    io = dict(np.load(folder / "io.npz"))
    meta = json.loads((folder / "meta.json").read_text())
    return io, meta, folder


def rel_err(candidate, reference) -> float:
    """``max|candidate - reference| / max|reference|`` (the fixtures' metric)."""
    candidate = np.asarray(candidate, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    assert candidate.shape == reference.shape, (candidate.shape, reference.shape)
    return float(np.abs(candidate - reference).max() / np.abs(reference).max())


PARITY_REPORT = cn.config.get("CANDLE_NN_PARITY_REPORT") or None


def assert_matches(meta: dict, key: str, candidate, reference) -> float:
    """Assert the fixture tolerance for output ``key``; returns the error.

    With ``CANDLE_NN_PARITY_REPORT=FILE`` every comparison is also appended to FILE as
    ``test id, output, error, tolerance`` (the evidence for a device run).
    """
    tol = meta["tolerance"][key]["rtol_of_max_abs"]
    err = rel_err(candidate, reference)
    if PARITY_REPORT:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(PARITY_REPORT, "a") as fh:
            fh.write(f"{test}\t{key}\t{err:.2e}\t{tol:.1e}\n")
    assert err <= tol, f"{key}: rel err {err:.3e} > tolerance {tol:.1e}"
    return err


def nchw_to_nhwc(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def nhwc_to_nchw(a) -> np.ndarray:
    return np.asarray(a).transpose(0, 3, 1, 2)


@pytest.fixture(scope="session")
def resnet18_fixture() -> tuple[dict[str, np.ndarray], dict, Path]:
    """The ResNet-18 reference (io arrays, meta, folder), loaded once per test session."""
    return load_fixture("resnet18")


DEVICES = cn.Device.available()


@pytest.fixture(params=DEVICES, ids=[str(d) for d in DEVICES])
def device(request) -> cn.Device:
    """Every device this machine has (the CPU, and each GPU when MLX has one)."""
    return request.param


HAS_GPU = len(DEVICES) > 1


@pytest.fixture
def two_devices(monkeypatch):
    """``(cpu, gpu)``: the real GPU when there is one, else a Device('gpu') object built with the
    GPU count patched (no op may run on it); the fake is un-interned afterwards."""
    if HAS_GPU:
        yield cn.Device.cpu(), cn.Device.gpu(0)
        return
    monkeypatch.setattr(cn_device, "_gpu_count", lambda: 1)
    gpu = cn.Device("gpu")
    try:
        yield cn.Device.cpu(), gpu
    finally:
        cn.Device._interned.pop(("gpu", 0), None)


def error_line(stderr: "str | bytes", *fragments: str) -> str:
    """The CLI contract for a bad input, checked on stderr's text (a child process's bytes too):
    exactly one ``error: …`` line naming each of ``fragments``, no traceback. Returns that line."""
    text = stderr.decode() if isinstance(stderr, bytes) else stderr
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def one_error_line(capsys, *fragments: str, quiet_stdout: bool = False) -> str:
    """:func:`error_line` on what this test's CLI call printed (and, with ``quiet_stdout``,
    nothing on stdout)."""
    captured = capsys.readouterr()
    assert not (quiet_stdout and captured.out), captured.out
    return error_line(captured.err, *fragments)


@pytest.fixture(params=["fast", "reference"])
def op_paths(request):
    """Run a test twice: with every registered op implementation on, and with every one off (the
    ops' plain-MLX references), switched through the registry (``cn.ops.disabled``)."""
    if request.param == "reference":
        with cn.ops.disabled("cpu", "cuda"):
            yield request.param
    else:
        yield request.param


# The CPU implementations that are plain MLX (used where the C++ kernels are not built).
PURE_MLX_CPU = ("silu_poly", "gelu_poly", "depthwise_shifted")


@pytest.fixture(params=["native", "fallback"] if cpu_kernels.module() is not None
                else ["fallback"])
def path(request):
    """Run a test through the compiled CPU kernels (where built) and through the pure-MLX
    fallback (every CPU implementation but the pure-MLX ones switched off)."""
    assert cn.ops.is_enabled("cpu")
    if request.param == "fallback":
        with cn.ops.only(*PURE_MLX_CPU, backend="cpu"):
            yield request.param
    else:
        yield request.param
