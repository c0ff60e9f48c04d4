"""Issue 15 on the CLI side, one test per item: FIFOs never hang (3), images that used to raise
tracebacks (4: decompression bombs, extreme aspect ratios, non-UTF-8 names and stdout, --size,
Ctrl-C), non-finite outputs (5), and all-or-nothing output files (6). Hangs and signals are tested
in child processes with a timeout."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
from PIL import Image
from safetensors import safe_open
from safetensors.numpy import save_file

from helpers.cli import bomb_png, cli_command, cli_env, noise, run_cli
from conftest import FIXTURES, ROOT, error_line, fixture_dir
from candle_nn.atomic_write import is_staging
from candle_nn_models.imagenet import preprocess
import candle_nn_models.imagenet as imagenet
from candle_nn_models.scripts import resnet, segment_anything, yolo_v8
from candle_nn_models.scripts.run_manifest import MANIFEST

BIKE = FIXTURES / "images" / "bike.jpg"


@pytest.fixture(scope="module")
def weights():
    return {"resnet": fixture_dir("resnet18") / "weights.safetensors",
            "yolo": fixture_dir("yolov8n") / "weights.safetensors",
            "sam": fixture_dir("mobile_sam") / "weights.safetensors"}


def _args(cli, weights, tmp_path):
    extra = {"resnet": ["--top-k", "1"], "yolo": ["--size", "64", "--out", tmp_path / "out"],
             "sam": ["--point", "0.5,0.5", "--out", tmp_path / "out"]}[cli]
    return ["--weights", weights[cli], *extra]


# --- item 3: FIFOs -------------------------------------------------------------------------

@pytest.mark.parametrize("cli", ["resnet", "yolo"])
def test_fifo_in_a_folder_is_skipped_not_read(cli, weights, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(BIKE, folder / "a.jpg")
    os.mkfifo(folder / "b.jpg")
    proc = run_cli(cli, "--image", folder, *_args(cli, weights, tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    err = proc.stderr.decode().splitlines()
    assert err == [f"error: {folder / 'b.jpg'}: a FIFO (named pipe), not a regular file: skipped",
                   "2 images: 1 ok, 1 failed"]


@pytest.mark.parametrize("cli", ["resnet", "yolo", "sam"])
def test_fifo_as_the_image_is_refused_at_once(cli, weights, tmp_path):
    fifo = tmp_path / "photo.jpg"
    os.mkfifo(fifo)
    proc = run_cli(cli, "--image", fifo, *_args(cli, weights, tmp_path), timeout=60)
    assert proc.returncode == 1
    error_line(proc.stderr, "photo.jpg", "FIFO")


def test_a_folder_where_an_image_file_is_expected_is_one_message(tmp_path):
    """load_rgb on a folder (candle-nn-app --sample DIR): an ImageInputError, not the
    IsADirectoryError of os.fdopen (a traceback in the app)."""
    from candle_nn_models.scripts.common import ImageInputError, load_rgb

    with pytest.raises(ImageInputError) as err:
        load_rgb(tmp_path)
    assert str(err.value) == f"{tmp_path}: a folder, not an image file"


# --- item 4: decompression bombs -----------------------------------------------------------

@pytest.mark.parametrize("cli", ["resnet", "yolo", "sam"])
def test_decompression_bomb_is_refused_with_the_flag_to_raise_the_limit(cli, weights, tmp_path):
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(bomb_png(20000, 20000))
    assert len(bomb.read_bytes()) < 100
    proc = run_cli(cli, "--image", bomb, *_args(cli, weights, tmp_path), timeout=60)
    assert proc.returncode == 1
    error_line(proc.stderr, "bomb.png", "20000x20000", "400.0 Mpx", "179.0 Mpx limit",
               "--max-pixels 400000000")


def test_max_pixels_sets_the_limit(capsys, weights, tmp_path):
    image = tmp_path / "small.png"
    Image.fromarray(noise(30, 40)).save(image)
    argv = ["--image", str(image), "--weights", str(weights["resnet"]), "--top-k", "1"]
    assert resnet.main([*argv, "--max-pixels", "1000"]) == 1
    assert "1200 pixels, above the 1000 pixels limit" in capsys.readouterr().err
    assert resnet.main([*argv, "--max-pixels", "1200"]) == 0
    # above the limit the header is believed, and the data is not there
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(bomb_png(20000, 20000))
    assert resnet.main(["--image", str(bomb), "--weights", str(weights["resnet"]),
                        "--max-pixels", "4e8"]) == 1
    assert "not a readable image" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        resnet.main([*argv, "--max-pixels", "0"])


# --- item 4: extreme aspect ratios ---------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 1281), (1, 3000), (5000, 2)])
def test_yolo_extreme_aspect_ratios_give_results(capsys, weights, tmp_path, shape):
    """ZeroDivisionError above 1280:1 before: the letterboxed short side rounded to 0 px."""
    image = tmp_path / "strip.png"
    Image.fromarray(noise(*shape)).save(image)
    code = yolo_v8.main(["--image", str(image), "--weights", str(weights["yolo"]),
                         "--out", str(tmp_path / "out"), "--json"])
    assert code == 0, capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    assert (doc["images"][0]["height"], doc["images"][0]["width"]) == shape
    with Image.open(doc["images"][0]["output"]) as drawn:
        assert drawn.size == shape[::-1]


def test_resnet_extreme_aspect_ratios_give_results(capsys, weights, tmp_path):
    """30000x1 ran out of memory (a 7.7 Mpx x 256 resize); now only the crop's span is resized."""
    image = tmp_path / "strip.png"
    Image.fromarray(noise(1, 30000)).save(image)
    assert resnet.main(["--image", str(image), "--weights", str(weights["resnet"]),
                        "--top-k", "1"]) == 0
    assert capsys.readouterr().out.startswith(f"{image}:")


@pytest.mark.parametrize("shape", [(1, 1000), (1000, 1), (7, 2100), (2100, 7), (20, 700)])
def test_resnet_crop_span_resize_matches_the_full_resize(shape, monkeypatch):
    rgb = noise(*shape, seed=3)
    fast = preprocess(rgb)
    monkeypatch.setattr(imagenet, "LONG_SIDE_LIMIT", 10**9)  # the plain full-size resize
    full = preprocess(rgb)
    # In 0..255 units: the same pixels up to PIL's float rounding of the filter positions.
    assert np.abs((fast - full) * imagenet.STD * 255).max() <= 1.0 + 1e-4


def test_sam_too_elongated_image_is_a_clear_error(capsys, weights, tmp_path):
    image = tmp_path / "strip.png"
    Image.fromarray(noise(1, 2049)).save(image)
    code = segment_anything.main(["--image", str(image), "--point", "0.5,0.5",
                                  "--weights", str(weights["sam"]), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert "2049x1 is too elongated" in err and "at most 2048:1" in err


# --- item 4: file names that are not UTF-8, stdout that is not UTF-8 -----------------------

ASCII_ENV = {"LC_ALL": "C", "PYTHONIOENCODING": "ascii"}


@pytest.mark.parametrize("cli", ["resnet", "yolo"])
def test_non_utf8_names_on_an_ascii_stdout(cli, weights, tmp_path):
    odd = tmp_path / os.fsdecode(b"caf\xe9.jpg")
    shutil.copy(BIKE, odd)
    for extra in ([], ["--json"]):
        proc = run_cli(cli, "--image", odd, *_args(cli, weights, tmp_path), *extra,
                       env=cli_env(**ASCII_ENV))
        assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr.decode()
        out = proc.stdout.decode("ascii")
        assert "caf\\xe9.jpg" in (json.loads(out)["images"][0]["image"] if extra else out)
    if cli == "yolo":
        written = [p.name for p in (tmp_path / "out").iterdir() if p.name != MANIFEST]
        assert written == [os.fsdecode(b"caf\xe9_detect.jpg")]


def test_sam_non_utf8_name_on_an_ascii_stdout(weights, tmp_path):
    """The SAM CLI wrote its files, then crashed printing their names."""
    odd = tmp_path / os.fsdecode(b"\xff\xfe.jpg")
    shutil.copy(BIKE, odd)
    proc = run_cli("sam", "--image", odd, *_args("sam", weights, tmp_path),
                   env=cli_env(**ASCII_ENV))
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr.decode()
    out = proc.stdout.decode("ascii")
    assert "\\xff\\xfe.jpg: 800x556" in out and "wrote" in out and "\\xff\\xfe_overlay.png" in out
    assert sorted(os.fsencode(p.name) for p in (tmp_path / "out").iterdir()
                  if p.name != MANIFEST) == [
        b"\xff\xfe_mask.png", b"\xff\xfe_masks.json", b"\xff\xfe_overlay.png"]


# --- item 4: --size bound ------------------------------------------------------------------

def test_yolo_size_has_an_upper_bound(capsys):
    with pytest.raises(SystemExit) as exc:
        yolo_v8.main(["--image", str(BIKE), "--size", "32000"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "32000 is above 4096" in err and "Traceback" not in err
    assert yolo_v8.build_parser().parse_args(["--image", "x", "--size", "4096"]).size == 4096


# --- item 4: Ctrl-C ------------------------------------------------------------------------

def _interrupt(argv, wait_for: bytes | None, delay: float):
    """Start ``argv``; after ``wait_for`` appears on stderr (if given) and ``delay`` seconds,
    send SIGINT. Returns (exit status, stderr, seconds from the signal to the exit)."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            cwd=ROOT, env=cli_env())
    seen = b""
    deadline = time.monotonic() + 120
    while wait_for is not None and wait_for not in seen and time.monotonic() < deadline:
        if select.select([proc.stderr], [], [], 1.0)[0]:
            seen += os.read(proc.stderr.fileno(), 4096)
    time.sleep(delay)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=60)[1]
    return proc.returncode, (seen + rest).decode(), time.monotonic() - sent


@pytest.mark.parametrize("moment", ["start-up", "encoder"])
def test_ctrl_c_exits_130_with_one_line(weights, tmp_path, moment):
    out_dir = tmp_path / "out"
    images = [tmp_path / f"bike{i}.jpg" for i in range(16)]
    for image in images:
        shutil.copyfile(BIKE, image)
    argv = cli_command("sam", "--image", *images, "--point", "0.5,0.5", "--weights",
                       weights["sam"], "--out", out_dir, "--verbose")
    # --verbose prints the runtime summary right before the weights load; the MobileSAM encoder
    # starts ~0.1 s later and runs once per image (0.5-2 s each on a 2-core CPU), so 1.5 s after
    # it the run is inside a forward, long before the sixteenth image.
    wait_for, delay = (None, 0.3) if moment == "start-up" else (b"float32 precision", 1.5)
    code, err, latency = _interrupt(argv, wait_for, delay)
    assert code == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "error: interrupted", err
    assert latency < 5.0  # not after the forward: the watcher thread exits at once
    written = [p.name for p in out_dir.iterdir()] if out_dir.exists() else []
    assert not any(is_staging(name) for name in written), written  # no staged file left
    assert not any(name.startswith("bike15") for name in written), written  # stopped early


# --- item 5: non-finite outputs ------------------------------------------------------------

def _nan_weights(source, target):
    with safe_open(str(source), framework="numpy") as f:
        tensors = {k: np.full_like(f.get_tensor(k), np.nan) if f.get_tensor(k).dtype.kind == "f"
                   else f.get_tensor(k) for k in f.keys()}
        metadata = f.metadata()
    save_file(tensors, str(target), metadata=metadata)
    return target


@pytest.mark.parametrize("cli", ["resnet", "yolo", "sam"])
def test_all_nan_weights_are_an_error_naming_the_file(cli, weights, tmp_path):
    nan = _nan_weights(weights[cli], tmp_path / "nan.safetensors")
    args = [a if a != weights[cli] else nan for a in _args(cli, weights, tmp_path)]
    proc = run_cli(cli, "--image", BIKE, *args)
    assert proc.returncode == 1 and proc.stdout == b""
    error_line(proc.stderr, "non-finite outputs", str(nan))
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


# --- item 6: a run's outputs together or not at all ----------------------------------------

class _DiskFull:
    def save(self, fh, format=None, **options):
        fh.write(b"half an image")
        raise OSError(28, "No space left on device")


def test_sam_leaves_no_mask_when_the_overlay_cannot_be_written(capsys, weights, tmp_path,
                                                               monkeypatch):
    from candle_nn_models.segment_anything import SamPredictor

    monkeypatch.setattr(SamPredictor, "set_image", lambda self, rgb: None)  # the loop, not SAM
    monkeypatch.setattr(SamPredictor, "predict", lambda self, **kw: (
        np.ones((1, 556, 800), bool), np.array([0.9]), np.zeros((1, 256, 256))))
    monkeypatch.setattr(segment_anything, "overlay_image", lambda *a: _DiskFull())
    code = segment_anything.main(["--image", str(BIKE), "--point", "0.5,0.5",
                                  "--weights", str(weights["sam"]), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "bike_overlay.png" in err
    assert "No space left" in err
    assert os.listdir(tmp_path) == []  # neither the mask nor a temporary file


@pytest.mark.parametrize("strict", [False, True])
def test_yolo_failed_write_keeps_only_what_was_reported(capsys, weights, tmp_path, monkeypatch,
                                                        strict):
    """A disk full at the second image ends the run: the first image's file, printed as
    written, stays (none with --strict, which prints nothing until the run succeeds); the second
    leaves nothing, not even a staging file."""
    drawings = iter([None, _DiskFull()])
    real = yolo_v8.draw_detections
    monkeypatch.setattr(yolo_v8, "draw_detections",
                        lambda *a, **kw: next(drawings) or real(*a, **kw))
    second = tmp_path / "second.jpg"
    shutil.copy(BIKE, second)
    out_dir = tmp_path / "out"
    code = yolo_v8.main(["--image", str(BIKE), str(second), "--weights", str(weights["yolo"]),
                         "--size", "64", "--out", str(out_dir), *(["--strict"] if strict else [])])
    out, err = capsys.readouterr()
    assert code == 1 and err.count("\n") == 1 and "second_detect.jpg" in err
    if strict:
        assert out == "" and not out_dir.exists()
    else:
        assert f"-> {out_dir / 'bike_detect.jpg'}" in out
        assert sorted(os.listdir(out_dir)) == [MANIFEST, "bike_detect.jpg"]
