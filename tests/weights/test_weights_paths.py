"""A weights path that is not a readable regular file says what it is, in every CLI."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile

import pytest
from conftest import FIXTURES, ROOT, fixture_dir

import candle_nn as cn
from candle_nn.var_builder import check_weights_path
from candle_nn_models.weights.cli import main as weights_main
from candle_nn_models.weights.registry import resolve_weights

BIKE = str(FIXTURES / "images" / "bike.jpg")

CLI_RUNS = """
import sys
from candle_nn_models.scripts import resnet, segment_anything, yolo_v8
image, out = sys.argv[1], sys.argv[2]
for weights in sys.argv[3:]:
    for main, extra in ((resnet.main, []), (yolo_v8.main, ["--out", out]),
                        (segment_anything.main, ["--point", "0.5,0.5", "--out", out])):
        print(main(["--image", image, "--weights", weights, *extra]), flush=True)
"""


def test_fifo_directory_and_device_as_weights_say_what_they_are(tmp_path):
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.safetensors"
    folder.mkdir()
    # A subprocess with a timeout: a FIFO opened for reading would block forever.
    proc = subprocess.run(
        [sys.executable, "-c", CLI_RUNS, BIKE, str(tmp_path / "out"), str(fifo), str(folder),
         "/dev/null"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.stdout.split() == ["1"] * 9, proc.stderr
    errors = proc.stderr.strip().splitlines()
    assert errors == (
        [f"error: weights file {fifo} is a named pipe (FIFO), not a regular file"] * 3
        + [f"error: weights file {folder} is a directory, not a file"] * 3
        + ["error: weights file /dev/null is a character device, not a regular file"] * 3)
    assert not (tmp_path / "out").exists()


@contextlib.contextmanager
def _unprivileged():
    """Run the block as `nobody` when the tests run as root (root reads any file)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def unreadable():
    """A weights file in a world-searchable folder that its reader may not read (mode 000)."""
    folder = tempfile.mkdtemp(prefix="candle-nn-perm-")
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "weights.safetensors")
    with open(fixture_dir("resnet18") / "weights.safetensors", "rb") as src, \
            open(path, "wb") as dst:
        dst.write(src.read(4096))
    os.chmod(path, 0)
    yield path
    os.chmod(path, 0o644)
    os.unlink(path)
    os.rmdir(folder)


def test_permission_denied_says_so(unreadable, tmp_path, capsys):
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    (hidden / "w.safetensors").write_bytes(b"x")
    os.chmod(hidden, 0o000 if os.geteuid() != 0 else 0o700)  # root: `nobody` cannot enter it
    try:
        with _unprivileged():
            with pytest.raises(cn.WeightsFileError) as denied:
                cn.VarBuilder.from_safetensors(unreadable)
            with pytest.raises(cn.WeightsFileError) as resolved:
                resolve_weights("resnet", "resnet18", unreadable)
            with pytest.raises(cn.WeightsFileError) as unreachable:
                check_weights_path(hidden / "w.safetensors")
            rc = weights_main(["convert", "--from", "timm", unreadable,
                               str(tempfile.gettempdir() + "/never-written.safetensors")])
    finally:
        os.chmod(hidden, 0o700)
    for exc in (denied, resolved):
        assert str(exc.value) == (f"permission denied reading weights file {unreadable}: this "
                                  "user may not read it (chmod +r?)")
    assert str(unreachable.value).startswith("permission denied: cannot reach weights file ")
    assert rc == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"error: permission denied reading checkpoint {unreadable}: this user may "
                   "not read it (chmod +r?)")
