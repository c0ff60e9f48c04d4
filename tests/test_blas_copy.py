"""The renamed BLAS copy's cache: one complete file under concurrent first imports, a new copy
(and the stale one deleted) when the source library changes, private directories only."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from candle_nn import blas, blas_copy
from conftest import ROOT

REPORT = "import candle_nn, json; print(json.dumps(candle_nn.info()['blas']))"


def _source() -> str:
    found = blas._pip_openblas() or [p for p in map(blas._resolve, blas._candidates()) if p]
    if not found or blas._bundled_reference_blas() is None:
        pytest.fail("needs MLX's Linux wheel and an optimized BLAS (ngsolve-openblas)")
    return found[0]


def _start(cache, umask: int = 0o022, **env: str) -> subprocess.Popen:
    full = {k: v for k, v in os.environ.items() if k not in ("CANDLE_NN_BLAS", "LD_PRELOAD")}
    full.update(env, XDG_CACHE_HOME=str(cache))
    return subprocess.Popen([sys.executable, "-W", "error", "-c", REPORT], cwd=ROOT, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: os.umask(umask))


def _report(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def _entries(cache) -> list[str]:
    return sorted(os.listdir(cache / "candle_nn" / "blas"))


def test_concurrent_first_imports_share_one_complete_copy(tmp_path) -> None:
    _source()
    # umask 002 (user-private groups): the directories are still made private
    reports = [_report(p) for p in [_start(tmp_path, umask=0o002) for _ in range(3)]]
    assert {r["state"] for r in reports} == {"preloaded"}, reports
    entries = _entries(tmp_path)
    copies = [e for e in entries if e.endswith(".so")]
    assert len(copies) == 1 and len(entries) == 2, entries  # the copy and its record, no temp files
    assert all(copies[0] in r["detail"] for r in reports)
    for directory in (tmp_path / "candle_nn", tmp_path / "candle_nn" / "blas"):
        assert oct(directory.stat().st_mode & 0o777) == "0o700", directory


def test_a_changed_source_gets_a_new_copy_and_the_stale_one_goes(tmp_path) -> None:
    source = tmp_path / "lib" / os.path.basename(_source())
    source.parent.mkdir()
    shutil.copy2(_source(), source)
    cache = tmp_path / "cache"
    first = _report(_start(cache, CANDLE_NN_BLAS=str(source)))
    assert first["state"] == "preloaded" and first["path"] == str(source), first
    before = _entries(cache)
    os.utime(source, ns=(1_000_000_000, 1_000_000_000))  # "a new version of the library"
    second = _report(_start(cache, CANDLE_NN_BLAS=str(source)))
    after = _entries(cache)
    assert second["state"] == "preloaded", second
    assert len(after) == 2 and not set(after) & set(before), (before, after)
    again = _report(_start(cache, CANDLE_NN_BLAS=str(source)))
    assert _entries(cache) == after and again["detail"] == second["detail"]  # cached: no new copy


def test_a_directory_others_can_write_is_refused(tmp_path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(blas_copy.CopyError, match="not a private directory"):
        blas_copy._private_dir(str(shared / "blas"))
    shared.chmod(0o700)
    assert blas_copy._private_dir(str(shared / "blas")) == str(shared / "blas")
    planted = shared / "blas" / "lib.so"
    planted.write_bytes(b"")
    planted.chmod(0o666)  # a cached file others could have replaced is not used
    assert not blas_copy._private(str(planted), stat.S_IFREG)
    planted.chmod(0o600)
    assert blas_copy._private(str(planted), stat.S_IFREG)


def test_an_unusable_cache_falls_back_to_the_temp_dir(tmp_path) -> None:
    _source()
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")  # XDG_CACHE_HOME/candle_nn cannot be created
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    report = _report(_start(blocked, TMPDIR=str(tmp)))
    assert report["state"] == "preloaded", report
    assert f"{tmp}/candle_nn-{os.getuid()}/blas/" in report["detail"], report
