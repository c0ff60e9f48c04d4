"""`convert` edge cases: bfloat16 safetensors sources, outputs that cannot be written."""

from __future__ import annotations

import os
import tempfile

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import fixture_dir, one_error_line
from candle_nn_models.weights.cli import main


@pytest.fixture(scope="module")
def bf16_resnet(tmp_path_factory):
    """The ResNet-18 fixture as a bfloat16 state_dict under timm's `model.` prefix."""
    tensors = load_file(fixture_dir("resnet18") / "weights.safetensors")
    path = tmp_path_factory.mktemp("bf16") / "r18-bf16.safetensors"
    mx.save_safetensors(str(path), {f"model.{k}": mx.array(v).astype(mx.bfloat16)
                                    for k, v in tensors.items()})
    return path, tensors


def test_bfloat16_safetensors_state_dict_converts_exactly(tmp_path, bf16_resnet):
    src, tensors = bf16_resnet
    out = tmp_path / "r18.safetensors"
    assert main(["convert", "--from", "timm", str(src), str(out)]) == 0
    converted = load_file(out)
    assert converted.keys() == tensors.keys()
    for name, value in tensors.items():
        widened = np.array(mx.array(value).astype(mx.bfloat16).astype(mx.float32))
        assert converted[name].dtype == np.float32
        np.testing.assert_array_equal(converted[name], widened, err_msg=name)


def test_output_in_a_missing_folder_or_a_file_is_one_line_and_nothing_written(
        tmp_path, capsys, bf16_resnet):
    src, _ = bf16_resnet
    out = tmp_path / "missing" / "r18.safetensors"
    assert main(["convert", "--from", "timm", str(src), str(out)]) == 1
    assert one_error_line(capsys) == (
        f"error: cannot write {out}: the folder {out.parent} does not exist")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["convert", "--from", "timm", str(src), str(blocker / "r.safetensors")]) == 1
    assert "is not a folder" in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_output_in_a_read_only_folder_is_one_line(capsys, bf16_resnet):
    src, _ = bf16_resnet
    folder = tempfile.mkdtemp(prefix="candle-nn-ro-")
    os.chmod(folder, 0o555)  # world-readable, nobody may write (root: see below)
    out = os.path.join(folder, "r18.safetensors")
    root = os.geteuid() == 0
    try:
        if root:  # root writes anywhere: run the command as `nobody`
            os.seteuid(65534)
        try:
            rc = main(["convert", "--from", "timm", str(src), out])
        finally:
            if root:
                os.seteuid(0)
        assert rc == 1
        assert one_error_line(capsys) == (
            f"error: cannot write {out}: the folder {folder} is not writable (permission denied)")
        assert os.listdir(folder) == []
    finally:
        os.chmod(folder, 0o755)
        os.rmdir(folder)


def test_a_failure_while_writing_leaves_no_partial_file(tmp_path, capsys, monkeypatch,
                                                        bf16_resnet):
    import safetensors.numpy

    def half_written(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"\0" * 100)
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left")

    monkeypatch.setattr(safetensors.numpy, "save_file", half_written)
    src, _ = bf16_resnet
    out = tmp_path / "r18.safetensors"
    assert main(["convert", "--from", "timm", str(src), str(out)]) == 1
    assert one_error_line(capsys) == (
        f"error: cannot write {out}: Error while serializing: I/O error: No space left")
    assert list(tmp_path.iterdir()) == []
