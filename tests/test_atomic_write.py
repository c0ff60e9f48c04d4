"""``candle_nn.atomic_write``: the one way every writer here (checkpoints, converted weights, SAM
embeddings, CLI outputs, videos, batch manifests, bench reports) gets whole files or none."""

from __future__ import annotations

import os
import stat

import pytest

from candle_nn.atomic_write import atomic_write, temp_beside


def test_the_file_appears_only_when_the_block_ends(tmp_path):
    path = tmp_path / "out.json"
    with atomic_write(path) as tmp:
        tmp.write_text("new")
        assert not path.exists()
        assert tmp.parent == tmp_path and tmp.name.startswith(".out-") and tmp.suffix == ".json"
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


def test_suffix_for_writers_that_append_their_own(tmp_path):
    assert temp_beside(tmp_path / "w.bin", suffix=".safetensors").suffix == ".safetensors"


def test_a_missing_folder_is_an_oserror(tmp_path):
    with pytest.raises(OSError):
        with atomic_write(tmp_path / "no" / "such" / "file.txt"):
            pass
