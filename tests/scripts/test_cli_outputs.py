"""Where the per-image CLIs put their files, and that every path they print is a file they wrote:
a fresh run folder per run (``out``, ``out2``, … unless ``--exist-ok``), one stem per input image
(``x.jpg`` and ``x.png`` do not collide), no stale or leftover files, staging names that fit
NAME_MAX and are cleaned after a SIGKILL, outputs never read back as inputs, write errors as one
line, ``--json`` documents after usage errors, unreadable subfolders skipped alone, and
ultralytics' ``--iou`` default. In-process at tiny sizes with the fixtures' weights."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, error_line, fixture_dir
from PIL import Image

import candle_nn_models.scripts.resnet as resnet_cli
import candle_nn_models.scripts.segment_anything as sam_cli
import candle_nn_models.scripts.yolo_v8 as yolo_cli
from helpers.cli import cli_command, cli_env
from candle_nn.atomic_write import is_staging, staging_name
from candle_nn_models.scripts.input_paths import expand_image_args

BIKE = FIXTURES / "images" / "bike.jpg"
NAME_MAX = 255


@pytest.fixture(scope="module")
def weights():
    return {"yolo": fixture_dir("yolov8n") / "weights.safetensors",
            "sam": fixture_dir("mobile_sam") / "weights.safetensors",
            "resnet": fixture_dir("resnet18") / "weights.safetensors"}


def run(capsys, cli, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def same_stem_inputs(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    small = Image.open(BIKE).resize((160, 111))
    small.save(folder / "x.jpg")
    small.save(folder / "x.png")
    return folder


def yolo(capsys, weights, *argv):
    return run(capsys, yolo_cli, "--weights", weights["yolo"], "--size", 64, "--conf", 0.55,
               *argv)


# -- 1. outputs in the right place, fresh, never left behind -------------------------------------

def test_same_stem_inputs_keep_labels_and_crops_in_their_folders(capsys, weights, tmp_path):
    inputs = same_stem_inputs(tmp_path / "in")
    out = tmp_path / "out"
    code, stdout, _ = yolo(capsys, weights, "--image", inputs, "--out", out, "--save-txt",
                           "--save-crop", "--json")
    assert code == 0
    doc = json.loads(stdout)
    written = files_under(out)
    assert [f for f in written if "/" not in f and not f.startswith(".")] == \
        ["x-2_detect.png", "x_detect.jpg"]
    assert [f for f in written if f.startswith("labels/")] == ["labels/x-2.txt", "labels/x.txt"]
    crops = [f for f in written if f.startswith("crops/")]
    assert crops and all(f.count("/") == 2 for f in crops)
    assert {Path(f).name.split(".")[0].rstrip("0123456789") for f in crops} <= {"x", "x-"}
    assert all(f.startswith(("labels/", "crops/", "x_detect", "x-2_detect", ".candle-nn-"))
               for f in written), written
    for image in doc["images"]:  # every printed path is a file this run wrote
        assert Path(image["output"]).is_file()


def test_everything_writes_the_masks_where_it_prints(capsys, weights, tmp_path):
    inputs = same_stem_inputs(tmp_path / "in")
    out = tmp_path / "out"
    code, stdout, _ = run(capsys, sam_cli, "--image", inputs, "--weights", weights["sam"],
                          "--everything", "--points-per-side", 2, "--pred-iou-thresh", 0,
                          "--stability-score-thresh", 0, "--out", out, "--json")
    assert code == 0
    doc = json.loads(stdout)
    assert len(doc["images"]) == 2
    for image in doc["images"]:
        masks = Path(image["files"]["masks"])
        assert masks.parent == out
        assert sorted(p.name for p in masks.iterdir()) == \
            sorted(f"{i}.png" for i in range(len(image["masks"])))
        assert Path(image["files"]["overlay"]).is_file() and Path(image["files"]["json"]).is_file()
    top = [f for f in files_under(out) if "/" not in f]
    assert top == [".candle-nn-outputs.json", "x-2_everything.png", "x-2_masks.json",
                   "x_everything.png", "x_masks.json"]


def test_rerun_gets_a_fresh_run_folder(capsys, weights, tmp_path):
    out = tmp_path / "out"
    for _ in range(3):
        code, _, _ = yolo(capsys, weights, "--image", BIKE, "--out", out)
        assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out2", "out3"]
    for folder in ("out", "out2", "out3"):
        assert (tmp_path / folder / "bike_detect.jpg").is_file()


def test_rerun_with_exist_ok_leaves_no_stale_masks(capsys, weights, tmp_path):
    image = tmp_path / "x.jpg"
    Image.open(BIKE).resize((160, 111)).save(image)
    out = tmp_path / "out"
    counts = []
    for stability in (0, 1):  # the second run keeps fewer masks (none)
        code, stdout, _ = run(capsys, sam_cli, "--image", image, "--weights", weights["sam"],
                              "--everything", "--points-per-side", 3, "--box-nms-thresh", 1,
                              "--pred-iou-thresh", 0, "--stability-score-thresh", stability,
                              "--out", out, "--exist-ok", "--json")
        assert code == 0
        counts.append(len(json.loads(stdout)["images"][0]["masks"]))
        listed = json.loads((out / "x_masks.json").read_text())["masks"]
        files = json.loads(stdout)["images"][0]["files"]
        assert all(path is None or Path(path).exists() for path in files.values()), files
        assert sorted(p.name for p in (out / "x_masks").glob("*.png")) == \
            sorted(f"{i}.png" for i in range(len(listed)))
    assert counts[0] > counts[1], counts
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "x.jpg"]


def test_exist_ok_never_overwrites_a_file_it_did_not_write(capsys, weights, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    mine = out / "bike_detect.jpg"
    mine.write_bytes(b"the user's own file")
    code, _, err = yolo(capsys, weights, "--image", BIKE, "--out", out, "--exist-ok")
    assert code == 1
    error_line(err, "bike_detect.jpg", "not written by this program")
    assert mine.read_bytes() == b"the user's own file"


def test_staging_left_by_a_killed_run_is_removed_by_the_next(weights, tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(12):
        Image.open(BIKE).resize((320 + 8 * i, 222)).save(inputs / f"img{i:02}.png")
    out = tmp_path / "out"
    argv = ["--image", inputs, "--weights", weights["yolo"], "--size", 64, "--out", out,
            "--strict", "--save-crop", "--conf", 0.55]  # --strict: staged until the end
    child = subprocess.Popen(cli_command("yolo", *argv), env=cli_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    staged: list[Path] = []
    while not staged and child.poll() is None and time.monotonic() < deadline:
        staged = [p for p in tmp_path.rglob("*") if p.name.startswith(".")
                  and p.is_file() and ".candle-nn-outputs" not in p.name]
        time.sleep(0.01)
    child.kill()
    child.wait()
    assert staged, "no staging file seen before the run ended"
    user_file = out / ".img00-abcd1234.png"  # looks like a temporary file, but is not ours
    user_file.write_bytes(b"keep me")
    child = subprocess.run(cli_command("yolo", *argv), env=cli_env(), capture_output=True,
                           timeout=300)
    assert child.returncode == 0, child.stderr
    left = [p for p in tmp_path.rglob("*") if p.is_file() and is_staging(p.name)]
    assert left == [] and user_file.read_bytes() == b"keep me"


def test_a_long_stem_fits_name_max(capsys, weights, tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    long_image = inputs / ("y" * 236 + ".png")
    Image.open(BIKE).resize((160, 111)).save(long_image)
    Image.open(BIKE).resize((160, 111)).save(inputs / "a.png")
    out = tmp_path / "out"
    code, stdout, err = yolo(capsys, weights, "--image", inputs, "--out", out, "--save-txt",
                             "--save-crop", "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert len(doc["images"]) == 2 and doc["errors"] == []
    for image in doc["images"]:
        assert Path(image["output"]).is_file()
    assert all(len(os.fsencode(p.name)) <= NAME_MAX for p in out.rglob("*"))
    assert len(staging_name(".png")) < 64


@pytest.mark.parametrize("exist_ok", [False, True])
def test_out_inside_the_input_folder_is_never_read_back(capsys, weights, tmp_path, exist_ok):
    inputs = tmp_path / "in"
    inputs.mkdir()
    Image.open(BIKE).resize((160, 111)).save(inputs / "a.png")
    out = inputs if exist_ok else inputs / "out"
    flags = ["--exist-ok"] if exist_ok else ["--recursive"]
    for _ in range(3):
        code, stdout, _ = yolo(capsys, weights, "--image", inputs, "--out", out, "--json", *flags)
        assert code == 0
        doc = json.loads(stdout)
        assert [Path(i["image"]).name for i in doc["images"]] == ["a.png"]
        assert doc["errors"] == []


# -- 2. write errors: one line, no partial file --------------------------------------------------

def _embedding_failure(kind: str):
    from safetensors import SafetensorError

    def save_file(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a safetensors file")
        if kind == "ENOSPC":  # what safetensors raises on a full disk
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: '
                                  'StorageFull, message: "No space left on device" })')
        code = getattr(errno, kind)
        raise OSError(code, os.strerror(code), filename)
    return save_file


@pytest.mark.parametrize("kind,message", [("ENOSPC", "No space left on device"),
                                          ("EACCES", "Permission denied"),
                                          ("EROFS", "Read-only file system")])
def test_save_embedding_write_error_is_one_line(capsys, weights, tmp_path, monkeypatch, kind,
                                               message):
    import safetensors.numpy

    monkeypatch.setattr(safetensors.numpy, "save_file", _embedding_failure(kind))
    target = tmp_path / "emb" / "bike.safetensors"
    target.parent.mkdir()
    code, _, err = run(capsys, sam_cli, "--image", BIKE, "--weights", weights["sam"],
                       "--point", "0.5,0.5", "--save-embedding", target, "--out",
                       tmp_path / "out")
    assert code == 1
    error_line(err, "cannot write", "bike.safetensors", message)
    assert os.listdir(target.parent) == []  # no partial file, no staging file


@pytest.mark.parametrize("kind", ["ENOSPC", "EACCES", "EROFS"])
def test_output_write_error_is_one_line(capsys, weights, tmp_path, monkeypatch, kind):
    class Fails:
        def save(self, fh, format=None, **options):
            fh.write(b"half")
            raise OSError(getattr(errno, kind), os.strerror(getattr(errno, kind)))

    monkeypatch.setattr(yolo_cli, "draw_detections", lambda *a, **k: Fails())
    out = tmp_path / "out"
    code, stdout, err = yolo(capsys, weights, "--image", BIKE, "--out", out)
    assert code == 1
    error_line(err, "cannot write", "bike_detect.jpg", os.strerror(getattr(errno, kind)))
    assert stdout == "" and not out.exists()


# -- 3. messages ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cli,argv,message", [
    (yolo_cli, ["--iou", "2"], "--iou"),
    (yolo_cli, ["--no-such-option"], "unrecognized arguments"),
    (yolo_cli, ["--save-conf"], "--save-txt"),
    (resnet_cli, ["--top-k", "0"], "--top-k"),
    (sam_cli, ["--box", "1,2"], "expected 4"),
    (sam_cli, ["--everything", "--point", "0.5,0.5"], "--everything"),
])
def test_json_document_even_after_a_usage_error(capsys, cli, argv, message):
    try:
        code = cli.main(["--image", str(BIKE), "--js", *argv])  # argparse takes a prefix too
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert code in (1, 2)
    doc = json.loads(out)
    (error,) = doc["errors"]
    assert error["fatal"] and message in error["reason"] and doc["images"] == []
    assert message in err and "Traceback" not in err


def test_unreadable_subfolder_is_skipped_alone(tmp_path, monkeypatch):
    for sub in ("a", "locked", "z"):
        (tmp_path / sub).mkdir()
        Image.new("RGB", (4, 4)).save(tmp_path / sub / "i.png")
    Image.new("RGB", (4, 4)).save(tmp_path / "top.png")
    real_scandir = os.scandir

    def scandir(path="."):  # root ignores permissions: refuse the listing here instead
        if Path(os.fsdecode(path)).name == "locked":
            raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    found = expand_image_args([str(tmp_path)], recursive=True)
    good = [p.path.relative_to(tmp_path).as_posix() for p in found if not p.error]
    assert good == ["top.png", "a/i.png", "z/i.png"]
    (bad,) = [p for p in found if p.error]
    assert bad.path == tmp_path / "locked" and "Permission denied" in bad.error


def test_written_files_follow_the_umask(capsys, weights, tmp_path):
    old = os.umask(0o027)
    try:
        code, _, _ = yolo(capsys, weights, "--image", BIKE, "--out", tmp_path / "out",
                          "--save-txt", "--save-crop", "--conf", 0.5)
    finally:
        os.umask(old)
    assert code == 0
    files = [p for p in (tmp_path / "out").rglob("*")]
    assert len(files) > 3
    for path in files:
        want = 0o750 if path.is_dir() else 0o640
        assert stat.S_IMODE(path.stat().st_mode) == want, path


# -- 4. defaults ---------------------------------------------------------------------------------

def test_iou_defaults_to_ultralytics_07(capsys, weights, tmp_path, monkeypatch):
    parser = yolo_cli.build_parser()
    assert parser.parse_args(["--image", "x.jpg"]).iou == 0.7
    assert "default 0.7" in " ".join(parser.format_help().split())
    from candle_nn_models.yolo import predict as pipeline  # where the CLI's NMS runs

    seen = []
    real = pipeline.postprocess

    def spy(*args, **kwargs):
        seen.append(kwargs["iou"])
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "postprocess", spy)
    code, _, _ = yolo(capsys, weights, "--image", BIKE, "--out", tmp_path / "out")
    assert code == 0 and seen == [0.7]


def test_default_run_folder_is_ultralytics(capsys, weights, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(BIKE, tmp_path / "bike.jpg")
    for _ in range(2):
        code, _, _ = run(capsys, yolo_cli, "--image", "bike.jpg", "--weights", weights["yolo"],
                         "--size", 64)
        assert code == 0
    assert sorted(p.name for p in (tmp_path / "runs" / "detect").iterdir()) == \
        ["predict", "predict2"]
