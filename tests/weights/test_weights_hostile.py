"""Hostile and foreign checkpoints: `convert` decides from the bytes what a file is and refuses,
before anything in it runs, whatever is not a plain torch.save pickle — for every --from."""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections import OrderedDict
from typing import Tuple

import numpy as np
import pytest
import torch  # the `test` extra: builds the files; convert itself never calls torch
from safetensors.numpy import load_file, save_file

from conftest import load_fixture, one_error_line
from candle_nn_models.weights.cli import main
from candle_nn_models.weights.convert import SOURCES


def _refused(tmp_path, capsys, src, kind: str) -> str:
    out = tmp_path / f"out-{kind}.safetensors"
    assert main(["convert", "--from", kind, str(src), str(out)]) == 1
    line = one_error_line(capsys, quiet_stdout=True)
    assert not out.exists() and not list(tmp_path.glob(f".out-{kind}*"))
    return line


class MarkerWriter(torch.nn.Module):
    """A scripted module whose TorchScript ``__setstate__`` writes a marker file when loaded."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker
        self.weight = torch.ones(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight

    @torch.jit.export
    def __getstate__(self) -> Tuple[str, torch.Tensor]:
        return (self.marker, self.weight)

    @torch.jit.export
    def __setstate__(self, state: Tuple[str, torch.Tensor]) -> None:
        self.training = False
        self.marker = state[0]
        self.weight = state[1]
        written = torch.from_file(self.marker, shared=True, size=6, dtype=torch.uint8)
        written.fill_(88)
        print(written.sum())  # keeps the write alive through TorchScript's dead-code pass


def test_torchscript_archive_is_refused_before_its_code_runs(tmp_path, capsys):
    marker = tmp_path / "pwned.txt"
    src = tmp_path / "best.pt"
    torch.jit.save(torch.jit.script(MarkerWriter(str(marker))), str(src))
    for kind in SOURCES:
        line = _refused(tmp_path, capsys, src, kind)
        assert "TorchScript archive" in line and "refusing" in line, line
        assert not marker.exists(), f"--from {kind} ran the archive's code"
    # The control: the archive really is hostile — loading it the way torch.load would runs it.
    torch.jit.load(str(src))
    assert marker.read_bytes() == b"X" * 6


def test_zip_with_records_a_torch_save_file_does_not_have_is_refused(tmp_path, capsys):
    src = tmp_path / "sd.pt"
    torch.save({"conv1.weight": torch.zeros(1)}, src)
    with zipfile.ZipFile(src, "a") as zf:
        zf.writestr("sd/extra/payload.py", "print('hi')")
    for kind in SOURCES:
        assert "holds sd/extra/payload.py" in _refused(tmp_path, capsys, src, kind)


class Exec:
    """A pickled object whose reconstruction would write a file."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_pickled_code_is_refused_in_both_layouts(tmp_path, capsys, zipped):
    marker = tmp_path / "pwned.txt"
    src = tmp_path / "evil.pt"
    torch.save({"model": None, "ema": Exec(marker), "conv1.weight": torch.zeros(1)}, src,
               _use_new_zipfile_serialization=zipped)
    for kind in SOURCES:
        assert "refusing to unpickle builtins.exec" in _refused(tmp_path, capsys, src, kind)
        assert not marker.exists()


def test_a_plain_pickle_that_runs_code_is_refused_without_running_it(tmp_path, capsys):
    """Deciding what a file is must not unpickle it (the legacy magic number is a pickle too)."""
    marker = tmp_path / "pwned.txt"
    src = tmp_path / "evil.pt"
    src.write_bytes(pickle.dumps(Exec(marker), protocol=2))
    for kind in SOURCES:
        assert "a plain Python pickle" in _refused(tmp_path, capsys, src, kind)
        assert not marker.exists()
    pickle.loads(src.read_bytes())  # the control: it does write the marker
    assert marker.read_text() == "pwned"


@pytest.mark.parametrize("protocol", [2, 4])
def test_legacy_torch_save_state_dict_converts_exactly(tmp_path, protocol):
    candle = load_file(load_fixture("resnet18")[2] / "weights.safetensors")
    src, out = tmp_path / "r18.pth", tmp_path / "r18.safetensors"
    sd = {k: torch.from_numpy(v) for k, v in candle.items()}
    sd["fc.bias"] = sd["fc.bias"].to(torch.bfloat16)  # widened to float32 exactly
    sd["layer1.0.bn1.num_batches_tracked"] = torch.tensor(7)
    torch.save(sd, src, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    assert main(["convert", "--from", "torchvision", str(src), str(out)]) == 0
    converted = load_file(out)
    assert converted.keys() == candle.keys()
    for name, value in candle.items():
        want = sd[name].float().numpy() if name == "fc.bias" else value
        np.testing.assert_array_equal(converted[name], want, err_msg=name)


def _write(path, content: bytes):
    path.write_bytes(content)
    return path


def _safetensors_bytes(tmp_path) -> bytes:
    save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "st"))
    return (tmp_path / "st").read_bytes()


def _truncated_torch_save(tmp_path) -> bytes:
    buf = io.BytesIO()
    torch.save({"a": torch.zeros(1000)}, buf)
    return buf.getvalue()[: len(buf.getvalue()) // 2]


def _zip_without_data_pkl() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/notes.txt", "hello")
    return buf.getvalue()


@pytest.mark.parametrize("make, expected", [
    (lambda tmp: b"", "is empty"),
    (lambda tmp: pickle.dumps({"conv1.weight": [1.0, 2.0]}), "a plain Python pickle"),
    (lambda tmp: b"\x89PNG\r\n\x1a\n" + bytes(64), "not a PyTorch checkpoint"),
    (_safetensors_bytes, "is a safetensors file"),
    (_truncated_torch_save, "damaged or truncated zip"),
    (lambda tmp: _zip_without_data_pkl(), "not a torch.save checkpoint"),
], ids=["empty", "plain-pickle", "png", "safetensors-as-pt", "truncated-zip", "foreign-zip"])
def test_other_formats_are_one_error_line_for_every_kind(tmp_path, capsys, make, expected):
    src = _write(tmp_path / "weights.pt", make(tmp_path))
    for kind in SOURCES:
        line = _refused(tmp_path, capsys, src, kind)
        assert expected in line, line


class _Storage:
    """Pickles as a persistent storage reference, as torch.save writes it."""

    def __init__(self, numel: int) -> None:
        self.numel = numel


class _Tensor:
    def __init__(self, storage: _Storage, size: tuple, stride: tuple) -> None:
        self.args = (storage, 0, size, stride, False, OrderedDict())

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.args)


class _ArchivePickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", torch.FloatStorage, "0", "cpu", obj.numel)
        return None


def test_tensor_reaching_past_its_storage_is_refused_not_read(tmp_path, capsys):
    """A hand-made torch.save zip whose tensor claims 10^6 elements of a 4-element storage."""
    buf = io.BytesIO()
    _ArchivePickler(buf, protocol=2).dump(
        {"conv1.weight": _Tensor(_Storage(4), (1000, 1000), (1000, 1))})
    src = tmp_path / "oob.pt"
    with zipfile.ZipFile(src, "w") as zf:
        zf.writestr("oob/data.pkl", buf.getvalue())
        zf.writestr("oob/data/0", np.arange(4, dtype=np.float32).tobytes())
        zf.writestr("oob/version", "3\n")
    for kind in SOURCES:
        assert "reaches element 999999 of a storage of 4" in _refused(tmp_path, capsys, src, kind)


def test_convert_never_imports_torch(tmp_path):
    """Reading a checkpoint is our code only: convert runs in a process where torch is absent."""
    import subprocess
    import sys

    src, out = tmp_path / "sd.pt", tmp_path / "sd.safetensors"
    candle = load_file(load_fixture("resnet18")[2] / "weights.safetensors")
    torch.save({"state_dict": {k: torch.from_numpy(v) for k, v in candle.items()}}, src)
    code = ("import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
            "from candle_nn_models.weights.cli import main\n"
            f"raise SystemExit(main(['convert', '--from', 'timm', {str(src)!r}, {str(out)!r}]))\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert load_file(out).keys() == candle.keys()


def test_compressed_entries_are_bounded_before_they_are_inflated(tmp_path, capsys):
    """A zip entry's inflated size is checked against the file before it is read: a ~0.3 MB
    file whose data.pkl inflates to 320 MB is refused with a peak allocation far below that
    (on the old reader it was inflated whole, then converted)."""
    import tracemalloc

    plain = tmp_path / "plain.pt"
    torch.save({"w": torch.ones(2)}, plain)
    src = tmp_path / "bomb.pt"
    with zipfile.ZipFile(plain) as zin, \
            zipfile.ZipFile(src, "w", compression=zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if not info.filename.endswith("data.pkl"):
                zout.writestr(info, data)
                continue
            # the real pickle, then 320 MB of zeros after its STOP (ignored by an unpickler)
            with zout.open(info.filename, "w", force_zip64=True) as entry:  # deflated
                entry.write(data)
                chunk = bytes(1 << 20)
                for _ in range(320):
                    entry.write(chunk)
    assert src.stat().st_size < 2_000_000
    tracemalloc.start()
    try:
        line = _refused(tmp_path, capsys, src, "torchvision")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "data.pkl" in line and "inflate" in line
    assert peak < 64 << 20, peak
