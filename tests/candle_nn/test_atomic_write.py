"""``candle_nn.atomic_write``: the one way every writer here (checkpoints, converted weights, SAM
embeddings, CLI outputs, videos, batch manifests, bench reports) gets whole files or none."""

from __future__ import annotations

import os
import stat

import pytest

from candle_nn.atomic_write import (atomic_write, is_staging, remove_live_staging,
                                    remove_stale_staging, staging_name,
                                    temp_beside)


def test_the_file_appears_only_when_the_block_ends(tmp_path):
    path = tmp_path / "out.json"
    with atomic_write(path) as tmp:
        tmp.write_text("new")
        assert not path.exists()
        assert tmp.parent == tmp_path and is_staging(tmp.name) and tmp.suffix == ".json"
    assert path.read_text() == "new"
    assert os.listdir(tmp_path) == ["out.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(path) as tmp:
            tmp.write_text("half")
            raise KeyboardInterrupt
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.txt"]


def test_usual_permissions_not_mkstemps_0600(tmp_path):
    old = os.umask(0o022)
    try:
        tmp = temp_beside(tmp_path / "a.png")
    finally:
        os.umask(old)
    assert stat.S_IMODE(tmp.stat().st_mode) == 0o644
    assert tmp.suffix == ".png"


def test_a_writer_that_replaces_the_staging_file_still_gives_the_usual_permissions(tmp_path):
    """safetensors' ``save_file`` replaces the file it is given with a 0600 one: the finished
    file still gets the umask's mode (as ``open(path, "w")``), so a converted checkpoint or a
    saved embedding is readable by whoever may read the folder's other files."""
    import numpy as np
    from safetensors.numpy import save_file

    old = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "w.safetensors") as tmp:
            save_file({"a": np.zeros(3, np.float32)}, str(tmp))
            assert stat.S_IMODE(tmp.stat().st_mode) == 0o600  # what the writer did
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "w.safetensors").stat().st_mode) == 0o644


def test_live_staging_files_are_removed_for_an_exit_without_unwinding(tmp_path):
    """What a CLI's signal thread removes before ``os._exit``: this process's staging files
    not yet renamed, never a file already committed nor one it did not make."""
    remove_live_staging()  # earlier tests' leftovers, if any
    pending = temp_beside(tmp_path / "a.mp4")
    renamed = temp_beside(tmp_path / "b.jsonl")
    os.replace(renamed, tmp_path / "b.jsonl")
    with atomic_write(tmp_path / "c.txt") as tmp:
        tmp.write_text("done")
    (tmp_path / staging_name(".png")).write_text("someone else's")
    assert remove_live_staging() == [pending]
    assert sorted(p.name for p in tmp_path.iterdir() if not is_staging(p.name)) == [
        "b.jsonl", "c.txt"]
    assert len([p for p in tmp_path.iterdir() if is_staging(p.name)]) == 1
    assert remove_live_staging() == []


def test_suffix_for_writers_that_append_their_own(tmp_path):
    assert temp_beside(tmp_path / "w.bin", suffix=".safetensors").suffix == ".safetensors"


def test_a_missing_folder_is_an_oserror(tmp_path):
    with pytest.raises(OSError):
        with atomic_write(tmp_path / "no" / "such" / "file.txt"):
            pass


def test_staging_names_fit_name_max_whatever_the_destination(tmp_path):
    long = tmp_path / ("y" * 250 + ".png")  # a staging name built from the stem would be > 255
    tmp = temp_beside(long)
    assert len(tmp.name) < 64 and tmp.suffix == ".png" and is_staging(tmp.name)
    assert len(staging_name("." + "x" * 300)) < 64  # an absurd suffix is dropped


def test_stale_staging_of_a_dead_process_is_removed_and_nothing_else(tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    live = temp_beside(tmp_path / "live.png")  # this process's own: still in use
    stale = live.with_name(live.name.replace(f"-{os.getpid()}-", f"-{pid}-"))
    stale.write_bytes(b"left by a SIGKILL")
    (tmp_path / "sub").mkdir()
    deep = tmp_path / "sub" / stale.name
    deep.write_bytes(b"left by a SIGKILL")
    user = [tmp_path / ".out-abcd1234.png", tmp_path / ".candle-nn-staging-notes.txt",
            tmp_path / "photo.png"]
    for path in user:
        path.write_bytes(b"the user's")
    assert remove_stale_staging(tmp_path) == [stale]
    assert remove_stale_staging(tmp_path, recursive=True) == [deep]
    assert live.exists() and all(path.read_bytes() == b"the user's" for path in user)
