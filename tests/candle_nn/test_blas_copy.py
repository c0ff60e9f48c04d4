"""The renamed BLAS copy (blas_copy.py): made in the package's ``_blas/`` folder (at install, or
by ``python -m candle_nn.make_blas_copy``), one complete file under concurrent makers, a new copy
(and the stale one deleted) when the source library changes, private folders only; and
``import candle_nn`` in a fresh HOME writes nothing there."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from candle_nn import blas, blas_copy
from conftest import ROOT


def _plan() -> tuple[str, str, dict[str, str]]:
    """``(source, target, needed)`` of the copy ``import candle_nn`` makes (blas.copy_plan)."""
    plan = blas.copy_plan()
    if plan is None:
        pytest.fail("needs MLX's Linux wheel and an optimized BLAS (ngsolve-openblas)")
    return plan


def _source() -> str:
    return _plan()[0]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CANDLE_NN_BLAS", "LD_PRELOAD")}
    return {**env, **extra}


def _make(folder, umask: int = 0o022) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "candle_nn.make_blas_copy", str(folder)],
                            cwd=ROOT, env=_env(CANDLE_NN_BLAS="off"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: os.umask(umask))


def test_concurrent_makers_share_one_complete_copy(tmp_path) -> None:
    _source()
    folder = tmp_path / "pkg" / "_blas"
    # umask 002 (user-private groups): the folder is still made private
    procs = [_make(folder, umask=0o002) for _ in range(3)]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        outs.append(out.strip())
    entries = sorted(os.listdir(folder))
    copies = [e for e in entries if e.endswith(".so")]
    assert len(copies) == 1 and len(entries) == 2, entries  # the copy and its record, no temp files
    assert set(outs) == {str(folder / copies[0])}
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert blas_copy.soname(str(folder / copies[0])) == blas_copy.soname(
        _plan()[1])


def test_a_changed_source_gets_a_new_copy_and_the_stale_one_goes(tmp_path) -> None:
    source = tmp_path / "lib" / os.path.basename(_source())
    source.parent.mkdir()
    shutil.copy2(_source(), source)
    target = _plan()[1]
    folder = str(tmp_path / "_blas")
    first = blas_copy.renamed_copy(str(source), target, directory=folder)
    before = sorted(os.listdir(folder))
    os.utime(source, ns=(1_000_000_000, 1_000_000_000))  # "a new version of the library"
    assert blas_copy.find(str(source), target, directory=folder) is None
    second = blas_copy.renamed_copy(str(source), target, directory=folder)
    after = sorted(os.listdir(folder))
    assert second != first and len(after) == 2 and not set(after) & set(before), (before, after)
    assert blas_copy.renamed_copy(str(source), target, directory=folder) == second  # found again
    assert sorted(os.listdir(folder)) == after


def test_a_directory_others_can_write_is_refused(tmp_path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(blas_copy.CopyError, match="not a private directory"):
        blas_copy._private_dir(str(shared))
    shared.chmod(0o700)
    assert blas_copy._private_dir(str(shared)) == str(shared)
    planted = shared / "lib.so"
    planted.write_bytes(b"")
    planted.chmod(0o666)  # a file others could have replaced is not used
    assert not blas_copy._private(str(planted), stat.S_IFREG)
    planted.chmod(0o600)
    assert blas_copy._private(str(planted), stat.S_IFREG)


def test_the_copy_lives_in_the_package() -> None:
    assert blas_copy.copy_dir() == str(ROOT / "candle_nn" / "_blas")
    report = blas.status()
    if report.state == "preloaded":
        assert blas_copy.copy_dir() in report.detail, report


def test_import_in_a_fresh_home_writes_nothing_there(tmp_path) -> None:
    """``import candle_nn`` (and its first CPU op) with an empty HOME and no XDG variables:
    nothing appears under HOME, and MLX still gets the optimized BLAS where one is installed."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in _env(HOME=str(home)).items() if not k.startswith("XDG_")}
    code = ("import candle_nn as cn, mlx.core as mx; "
            "mx.eval(mx.ones((64, 64)) @ mx.ones((64, 64)));"
            " print(cn.info()['blas']['state'])")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
    assert done.stdout.split()[-1] == blas.status().state
