"""Batches that survive (issue 12, item 1): many paths after one ``--image``, repeated ``--image``,
quoted globs, folders (``--recursive``), ``-`` for paths on stdin; a bad image is one stderr line
and skipped; a summary line; exit 0 when any image succeeded, 1 when none did; ``--strict``;
``--json`` is always one valid document with an ``errors`` list; progress only on a terminal.
Mostly in-process with ResNet-18 (the quickest model); YOLO and SAM where their loop differs."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import shutil
import struct
import subprocess
import sys
import termios

import pytest
from PIL import Image

from helpers.cli import cli_command, cli_env, noise
from conftest import FIXTURES, ROOT, error_line, fixture_dir
from candle_nn_models.scripts import resnet, segment_anything, yolo_v8
from candle_nn_models.scripts.input_paths import expand_image_args
from candle_nn_models.scripts.run_manifest import MANIFEST

BIKE = FIXTURES / "images" / "bike.jpg"


@pytest.fixture(scope="module")
def weights():
    return {"resnet": str(fixture_dir("resnet18") / "weights.safetensors"),
            "yolo": str(fixture_dir("yolov8n") / "weights.safetensors"),
            "sam": str(fixture_dir("mobile_sam") / "weights.safetensors")}


@pytest.fixture
def photos(tmp_path):
    """photos/{a,b}.jpg good, photos/c.jpg corrupt, photos/notes.txt, photos/sub/d.png good."""
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    for name in ("a.jpg", "b.jpg"):
        shutil.copy(BIKE, folder / name)
    (folder / "c.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (folder / "notes.txt").write_text("ignored: not an image suffix")
    Image.fromarray(noise(50, 70)).save(folder / "sub" / "d.png")
    return folder


def classify(capsys, weights, *argv):
    code = resnet.main(["--weights", weights["resnet"], "--top-k", "1", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_folder_with_a_corrupt_image_keeps_going(capsys, weights, photos):
    code, out, err = classify(capsys, weights, "--image", photos, "--json")
    assert code == 0
    doc = json.loads(out)
    assert [img["image"] for img in doc["images"]] == [str(photos / "a.jpg"), str(photos / "b.jpg")]
    assert doc["errors"] == [{"path": str(photos / "c.jpg"),
                              "reason": doc["errors"][0]["reason"]}]
    assert "not a readable image" in doc["errors"][0]["reason"]
    assert doc["summary"] == {"images": 3, "ok": 2, "failed": 1}
    lines = err.splitlines()
    assert lines == [f"error: {photos / 'c.jpg'}: {doc['errors'][0]['reason']}",
                     "3 images: 2 ok, 1 failed"]


def test_text_output_and_summary(capsys, weights, photos):
    code, out, err = classify(capsys, weights, "--image", photos / "c.jpg", photos / "a.jpg")
    assert code == 0
    assert out.splitlines()[0] == f"{photos / 'a.jpg'}:" and len(out.splitlines()) == 2
    assert err.splitlines()[-1] == "2 images: 1 ok, 1 failed"


def test_no_image_succeeds_exit_1(capsys, weights, photos, tmp_path):
    code, out, err = classify(capsys, weights, "--image", photos / "c.jpg", tmp_path / "none.jpg",
                              "--json")
    assert code == 1
    doc = json.loads(out)
    # Inputs that are missing are reported while listing, before the model loads: first.
    assert doc["images"] == [] and [e["path"] for e in doc["errors"]] == [
        str(tmp_path / "none.jpg"), str(photos / "c.jpg")]
    assert "image not found" in doc["errors"][0]["reason"]
    assert err.splitlines()[-1] == "2 images: 0 ok, 2 failed"


def test_strict_makes_a_failure_fatal(capsys, weights, photos):
    code, out, err = classify(capsys, weights, "--image", photos, "--strict")
    assert code == 1 and out == ""
    assert err.splitlines() == [f"error: {photos / 'c.jpg'}: " + err.split(": ", 2)[2].strip()]


def test_strict_writes_nothing(capsys, weights, photos, tmp_path):
    """YOLO with --strict: a.jpg and b.jpg were drawn (with labels and crops) before c.jpg
    failed; none is left, nor the folders made for them."""
    out_dir = tmp_path / "out"
    code = yolo_v8.main(["--image", str(photos), "--weights", weights["yolo"], "--size", "64",
                         "--out", str(out_dir), "--strict", "--save-txt", "--save-crop"])
    out, err = capsys.readouterr()
    assert code == 1 and "c.jpg" in err and err.count("\n") == 1
    assert out == ""  # a.jpg's result is not printed: it was not written
    assert not out_dir.exists()  # the files staged for a.jpg and b.jpg, and the folder, are gone


def test_many_paths_after_one_image_and_repeated(capsys, weights, photos):
    code, out, _ = classify(capsys, weights, "--image", photos / "a.jpg", photos / "b.jpg",
                            "--image", photos / "sub" / "d.png", "--json")
    assert code == 0
    assert [i["image"] for i in json.loads(out)["images"]] == [
        str(photos / "a.jpg"), str(photos / "b.jpg"), str(photos / "sub" / "d.png")]


def test_quoted_globs_are_expanded(capsys, weights, photos):
    code, out, _ = classify(capsys, weights, "--image", f"{photos}/[ab].jpg", "--json")
    assert code == 0 and len(json.loads(out)["images"]) == 2
    code, out, _ = classify(capsys, weights, "--image", f"{photos}/**/*.png", "--json")
    assert [i["image"] for i in json.loads(out)["images"]] == [str(photos / "sub" / "d.png")]
    code, out, err = classify(capsys, weights, "--image", f"{photos}/*.gif")
    assert code == 1 and "no file matches this pattern" in err and "*.gif" in err


def test_recursive_folders(capsys, weights, photos):
    code, out, _ = classify(capsys, weights, "--image", photos, "--recursive", "--json")
    doc = json.loads(out)
    assert code == 0 and [i["image"] for i in doc["images"]][-1] == str(photos / "sub" / "d.png")
    assert doc["summary"] == {"images": 4, "ok": 3, "failed": 1}
    code, _, err = classify(capsys, weights, "--image", photos.parent)  # only a subfolder
    assert code == 1 and "no image files" in err and "--recursive" in err


def test_paths_from_stdin(capsys, weights, photos, monkeypatch):
    listing = (f"{photos / 'a.jpg'}\n\n{photos / 'sub'}\n".encode()
               + os.fsencode(photos) + b"/c.jpg\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(listing)))
    code, out, _ = classify(capsys, weights, "--image", "-", "--json")
    doc = json.loads(out)
    assert code == 0 and [i["image"] for i in doc["images"]] == [
        str(photos / "a.jpg"), str(photos / "sub" / "d.png")]
    assert [e["path"] for e in doc["errors"]] == [str(photos / "c.jpg")]


def test_stdin_names_need_not_be_utf8(tmp_path):
    odd = tmp_path / os.fsdecode(b"\xe9t\xe9.jpg")
    shutil.copy(BIKE, odd)
    found = expand_image_args(["-"], stdin=io.BytesIO(os.fsencode(odd) + b"\n"))
    assert [(f.path, f.error) for f in found] == [(odd, None)]


def test_json_on_a_fatal_error_is_still_a_document(capsys, photos, tmp_path):
    code = resnet.main(["--image", str(photos), "--weights", str(tmp_path / "w.safetensors"),
                        "--json"])
    out, err = capsys.readouterr()
    assert code == 1
    error_line(err, "w.safetensors")
    doc = json.loads(out)
    assert doc["images"] == [] and doc["errors"][-1]["fatal"] is True
    assert "w.safetensors" in doc["errors"][-1]["reason"]


def test_sam_processes_every_image(capsys, weights, photos, tmp_path, monkeypatch):
    """SAM used to keep only the last --image. The encoder is replaced by a stub here: this test
    is about the loop (the real model runs in test_mobile_sam_cli and test_cli_hardening)."""
    import numpy as np

    from candle_nn_models.segment_anything import SamPredictor

    seen = []
    monkeypatch.setattr(SamPredictor, "set_image", lambda self, rgb: seen.append(rgb.shape))
    monkeypatch.setattr(SamPredictor, "predict", lambda self, **kw: (
        np.ones((1, *seen[-1][:2]), bool), np.array([0.9]), np.zeros((1, 256, 256))))
    code = segment_anything.main(["--image", str(photos), str(photos / "sub" / "d.png"),
                                  str(photos / "a.jpg"), "--point", "0.5,0.5",
                                  "--weights", weights["sam"], "--out", str(tmp_path / "out"),
                                  "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert [i["image"] for i in doc["images"]] == [str(photos / n) for n in ("a.jpg", "b.jpg",
                                                                            "sub/d.png", "a.jpg")]
    assert seen == [(556, 800, 3), (556, 800, 3), (50, 70, 3), (556, 800, 3)]
    # same stem twice
    assert doc["images"][-1]["files"]["mask"] == str(tmp_path / "out" / "a-2_mask.png")
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name != MANIFEST) == [
        "a-2_mask.png", "a-2_masks.json", "a-2_overlay.png", "a_mask.png", "a_masks.json",
        "a_overlay.png", "b_mask.png", "b_masks.json", "b_overlay.png", "d_mask.png",
        "d_masks.json", "d_overlay.png"]
    assert err.splitlines()[-1] == "5 images: 4 ok, 1 failed"


def _stderr_of(argv, tty: bool) -> str:
    if not tty:
        return subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT,
                              env=cli_env()).stderr
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=follower, cwd=ROOT,
                            env=cli_env())
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=180)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_progress_only_on_a_terminal(weights, photos):
    argv = cli_command("resnet", "--image", photos / "a.jpg", photos / "b.jpg", photos / "a.jpg",
                       "--weights", weights["resnet"], "--batch-size", "1")
    on_terminal = _stderr_of(argv, tty=True)
    assert "3/3" in on_terminal and "ms/img" in on_terminal, on_terminal
    piped = _stderr_of(argv, tty=False)
    assert piped.splitlines() == ["3 images: 3 ok, 0 failed"], piped
