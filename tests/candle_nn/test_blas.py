"""The fast CPU BLAS path: chosen at import, reported by info(), opt-out-able, numerically right.

Each case runs in a fresh interpreter, since the BLAS is chosen once, before MLX loads.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, fixture_dir

REPORT = "import candle_nn, json; print(json.dumps(candle_nn.info()))"

MATMUL = """
import candle_nn, json
import mlx.core as mx
import numpy as np
rng = np.random.default_rng(0)
a = rng.standard_normal((1024, 1024), dtype=np.float32)
b = rng.standard_normal((1024, 1024), dtype=np.float32)
with mx.stream(mx.cpu):
    c = np.array(mx.matmul(mx.array(a), mx.array(b)))
ref = a.astype(np.float64) @ b.astype(np.float64)
err = float(np.abs(c - ref).max() / np.abs(ref).max())
print(json.dumps({"blas": candle_nn.info()["blas"], "err": err}))
"""


def _python(code: str, **env: str) -> tuple[dict, str]:
    """Run ``code`` in a fresh interpreter; ``(json of its last stdout line, stderr)``."""
    import os

    full_env = {k: v for k, v in os.environ.items() if k not in ("CANDLE_NN_BLAS", "LD_PRELOAD")}
    full_env.update(env)
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.fixture(scope="module")
def available() -> str | None:
    """The optimized CBLAS this machine has (path), found without letting candle_nn load one."""
    code = ("import candle_nn.blas as b, json; "
            "found = next((p for p in map(b._resolve, b._candidates()) if p), None); "
            "print(json.dumps({'found': found, 'bundled': b._bundled_reference_blas()}))")
    result, _ = _python(code, CANDLE_NN_BLAS="off")
    return result["found"] if result["bundled"] else None


def test_info_names_the_blas_in_use(available) -> None:
    report, stderr = _python(REPORT)
    blas = report["blas"]
    assert report["mlx"] and report["devices"][0] == "cpu"
    assert report["float32_precision"] in ("exact", "tf32")
    assert blas["name"] and blas["detail"]
    assert "RuntimeWarning" not in stderr
    if available:  # MLX bundles the reference BLAS and a fast one is installed: it must be used
        assert blas["state"] == "preloaded", blas
        assert blas["path"] and blas["name"] != "reference"
    elif blas["state"] == "reference":  # nothing to load: the user is told how to get one
        assert "install" in blas["detail"]


@pytest.mark.skipif(not (sys.platform.startswith("linux") and platform.machine() == "x86_64"),
                    reason="ngsolve-openblas is a dependency on Linux x86_64 only")
def test_a_plain_install_gives_the_pip_openblas() -> None:
    """`pip install -e .` alone (no apt) gives MLX an optimized BLAS: pyproject's ngsolve-openblas,
    loaded with NumPy's gfortran runtime where the system has none. Same as
    `python -m candle_nn`."""
    done = subprocess.run([sys.executable, "-m", "candle_nn"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("CANDLE_NN_BLAS", "LD_PRELOAD")})
    assert done.returncode == 0, done.stderr
    assert "CPU BLAS: OpenBLAS 0.3.3" in done.stdout and "[preloaded" in done.stdout, done.stdout
    report, _ = _python(REPORT)
    assert "ngsolve_openblas" in report["blas"]["path"], report["blas"]
    assert report["blas"]["threads"] and report["blas"]["threads"] >= 1


@pytest.mark.parametrize("forced", ["Haswell", ""])
def test_a_forced_openblas_core_is_named(forced: str) -> None:
    """OPENBLAS_CORETYPE overrides OpenBLAS's CPU detection (an AVX2 kernel on an AVX-512 CPU
    halves sgemm throughput), so the BLAS description says when the core was forced."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    if forced:
        env["OPENBLAS_CORETYPE"] = forced
    done = subprocess.run([sys.executable, "-m", "candle_nn"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("CPU BLAS:"))
    if "OpenBLAS" not in line:
        assert "forced by" not in line
        return
    if forced:
        assert f"core {forced} (forced by OPENBLAS_CORETYPE={forced})" in line, line
    else:
        assert "forced by" not in line, line


def test_the_pip_openblas_is_found_first(tmp_path) -> None:
    """Detection without the real package: a package dir named ngsolve_openblas on the path."""
    package = tmp_path / "ngsolve_openblas"
    package.mkdir()
    (package / "__init__.py").write_text("raise AssertionError('must not be imported')\n")
    (package / "libopenblasp-r0.3.99.so").write_bytes(b"")
    code = ("import candle_nn.blas as b, json; "
            "print(json.dumps({'candidates': b._candidates(), 'pip': b._pip_openblas()}))")
    result, _ = _python(code, CANDLE_NN_BLAS="off", PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    expected = str(package / "libopenblasp-r0.3.99.so")
    assert result["pip"] == [expected]
    assert result["candidates"][0] == expected
    assert "libopenblas.so.0" in result["candidates"]  # the system library is still tried next


def test_a_bundled_gfortran_runtime_stands_in_for_libgfortran() -> None:
    """The wheel's OpenBLAS needs libgfortran.so.5; where the system has none (simulated: the
    loader's lookup finds none), its renamed copy names the runtime MLX's wheel bundles (hashed
    name, same library) by path, and loads."""
    code = """
import candle_nn.blas as b, candle_nn.blas_copy as c, json
b._loader_finds = lambda soname: soname != "libgfortran.so.5"
lib, source, copy = b._bind(b._pip_openblas()[0], b._bundled_reference_blas())
print(json.dumps({"runtimes": b._gfortran_runtimes(), "mlx_blas": b._bundled_reference_blas(),
                  "needed": c._run("--print-needed", copy).split(), "soname": c.soname(copy),
                  "sgemm": hasattr(lib, "cblas_sgemm")}))
"""
    result, _ = _python(code, CANDLE_NN_BLAS="off")
    # MLX's own (its LAPACK loads it too): beside the reference BLAS that MLX's wheel bundles, in
    # mlx_cpu.libs/ or, with MLX's CUDA build, mlx_cuda_13.libs/
    assert Path(result["runtimes"][0]).parent == Path(result["mlx_blas"]).parent, result
    assert Path(result["mlx_blas"]).parent.name.startswith("mlx_"), result
    assert result["runtimes"][0] in result["needed"] and "libgfortran.so.5" not in result["needed"]
    assert result["soname"].startswith("libblas-"), result
    assert result["sgemm"], result


@pytest.mark.parametrize("setting", ["off", "auto"])
def test_cli_warns_once_when_the_blas_is_slow(setting: str) -> None:
    """A CLI on the CPU prints ONE warning line (how slow, the fix) only without a fast BLAS."""
    weights = fixture_dir("resnet18") / "weights.safetensors"
    env = {k: v for k, v in os.environ.items() if k not in ("CANDLE_NN_BLAS", "LD_PRELOAD")}
    env["CANDLE_NN_BLAS"] = setting
    done = subprocess.run([sys.executable, "-m", "candle_nn_models.scripts.resnet", "--device",
                           "cpu", "--image", str(FIXTURES / "images" / "bike.jpg"),
                           "--weights", str(weights)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    warnings_ = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    report, _ = _python(REPORT, CANDLE_NN_BLAS=setting)
    if setting == "off" or report["blas"]["state"] == "reference":
        assert len(warnings_) == 1, done.stderr
        assert "reference BLAS" in warnings_[0] and "slower" in warnings_[0]
        fix = "fix: unset CANDLE_NN_BLAS" if setting == "off" else "fix: "
        assert fix in warnings_[0]
    else:
        assert warnings_ == [], done.stderr
    assert done.returncode == 0 and "bike.jpg:" in done.stdout, done.stderr


def test_opt_out_keeps_the_bundled_blas() -> None:
    report, stderr = _python(REPORT, CANDLE_NN_BLAS="off")
    assert report["blas"]["state"] == "reference"
    assert report["blas"]["path"] is None
    assert "CANDLE_NN_BLAS=off" in report["blas"]["detail"]
    assert "RuntimeWarning" not in stderr


def test_forcing_a_library_by_path(available) -> None:
    if available:
        report, _ = _python(REPORT, CANDLE_NN_BLAS=available)
        assert report["blas"]["state"] == "preloaded"
        assert "forced" in report["blas"]["detail"]
    report, stderr = _python(REPORT, CANDLE_NN_BLAS="/nonexistent/libnothing.so")
    assert report["blas"]["state"] == "reference"
    assert "could not be loaded" in stderr and "not found" in stderr


def test_forcing_a_library_by_soname() -> None:
    """A soname is found as the loader would find it (here: Debian's libopenblas.so.0 if the
    system has it) and bound like a path; an unknown one is a warning, not a failure."""
    result, _ = _python("import candle_nn.blas as b, json; "
                        "print(json.dumps(b._resolve('libopenblas.so.0')))", CANDLE_NN_BLAS="off")
    report, stderr = _python(REPORT, CANDLE_NN_BLAS="libopenblas.so.0")
    if result:
        assert report["blas"]["state"] == "preloaded" and report["blas"]["path"] == result
        assert "OpenBLAS" in report["blas"]["name"], report
    else:
        assert report["blas"]["state"] == "reference" and "could not be loaded" in stderr
    report, stderr = _python(REPORT, CANDLE_NN_BLAS="libnothing-at-all.so.7")
    assert report["blas"]["state"] == "reference" and "could not be loaded" in stderr


def test_importing_mlx_first_warns(available) -> None:
    report, stderr = _python("import mlx.core; " + REPORT)
    assert report["blas"]["state"] == "reference"
    assert "imported before candle_nn" in report["blas"]["detail"]
    if available:
        assert "mlx.core was imported before candle_nn" in stderr


# -- bound to MLX only: the rest of the process keeps its own BLAS ------------------------------
SCOPE = """
import candle_nn, ctypes, json
import mlx.core as mx
maps = open("/proc/self/maps").read()
scope = ctypes.CDLL(None)  # the global scope: what every other library's symbols resolve in first
print(json.dumps({"blas": candle_nn.info()["blas"],
                  "bundled": candle_nn.blas._bundled_reference_blas(),
                  "maps": maps, "global": [s for s in ("cblas_sgemm", "cblas_sgemm_batch", "sgemm_")
                                           if hasattr(scope, s)]}))
"""


def test_mlx_binds_the_renamed_copy_and_the_global_scope_stays_clean(available) -> None:
    result, _ = _python(SCOPE)
    if not available:
        pytest.fail(f"needs an optimized BLAS (ngsolve-openblas is a dependency): {result['blas']}")
    copy = result["blas"]["detail"].split("renamed copy ")[1].split(";")[0]
    assert copy in result["maps"], "libmlx.so's NEEDED libblas is the renamed OpenBLAS copy"
    assert result["bundled"] not in result["maps"], "the reference BLAS is not even loaded"
    assert result["global"] == [], "no BLAS symbol leaks into the process's global scope"


TORCH_NEXT_TO_MLX = """
import json
{imports}
import mlx.core as mx
import numpy as np
torch.manual_seed(0)
a, b = torch.randn(4, 5, 49, 32), torch.randn(4, 5, 32, 49)
x, y = torch.randn(8, 64, 32), torch.randn(8, 32, 64)
ref = lambda p, q: np.matmul(p.numpy().astype(np.float64), q.numpy().astype(np.float64))
errs = [float(np.abs((a @ b).numpy() - ref(a, b)).max()),            # 4-D batched matmul
        float(np.abs(torch.bmm(x, y).numpy() - ref(x, y)).max()),      # torch.bmm
        float(np.abs(torch.matmul(x, y).numpy() - ref(x, y)).max())]   # 3-D batched matmul
with mx.stream(mx.cpu):
    ours = np.array(mx.array(x.numpy()) @ mx.array(y.numpy()))                   # MLX, same process
    errs.append(float(np.abs(ours - ref(x, y)).max()))
print(json.dumps({{"errs": errs, "blas": candle_nn.blas.status().state}}))
"""


@pytest.mark.parametrize("imports", ["import candle_nn\nimport torch",
                                     "import torch\nimport candle_nn"],
                         ids=["candle_nn-first", "torch-first"])
def test_torch_batched_matmul_next_to_candle_nn(imports: str, available) -> None:
    """PyTorch's batched matmuls (MKL's cblas_sgemm_batch) in a process where candle_nn bound
    OpenBLAS to MLX. With OpenBLAS in the global scope (before the fix) this segfaulted."""
    done = subprocess.run([sys.executable, "-c", TORCH_NEXT_TO_MLX.format(imports=imports)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("CANDLE_NN_BLAS", "LD_PRELOAD")})
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert max(result["errs"]) < 1e-4, result  # float32, K=32: a few ulps
    assert result["blas"] == ("preloaded" if available else "reference"), result


def test_numpy_and_scipy_keep_their_own_blas(available) -> None:
    """NumPy's and SciPy's BLAS/LAPACK calls next to candle_nn: right, and not OpenBLAS 0.3.33's."""
    code = """
import candle_nn, json
import mlx.core as mx
import numpy as np, scipy.linalg
rng = np.random.default_rng(0)
a = rng.standard_normal((200, 200)); b = rng.standard_normal((200, 3))
errs = [float(np.abs(a @ np.linalg.solve(a, b) - b).max()),
        float(np.abs(a @ scipy.linalg.solve(a, b) - b).max()),
        float(np.abs(scipy.linalg.blas.sgemm(1.0, a, b) - a @ b).max() / np.abs(a @ b).max())]
libs = [line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line.lower()]
print(json.dumps({"errs": errs, "libs": sorted(set(libs)), "blas": candle_nn.blas.status().path}))
"""
    result, _ = _python(code)
    assert max(result["errs"][:2]) < 1e-9 and result["errs"][2] < 1e-5, result
    if available:  # the process holds NumPy's and SciPy's own OpenBLAS builds besides ours
        assert any("numpy" in lib for lib in result["libs"]), result
        assert any("scipy" in lib for lib in result["libs"]), result


@pytest.mark.parametrize("setting", ["auto", "off"])
def test_matmul_is_right_with_either_blas(setting: str) -> None:
    result, _ = _python(MATMUL, CANDLE_NN_BLAS=setting)
    if setting == "off":
        assert result["blas"]["state"] == "reference"
    # float32 with K=1024: errors of a few ulps of the largest output, whatever the BLAS
    assert result["err"] < 1e-5, result
