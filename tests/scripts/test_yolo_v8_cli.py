"""``candle-yolo-v8`` as a new user runs it: good images (detect and pose), and every way to get
it wrong. Runs in-process (``main([...])``) with the fixtures' weights, at ``--size 320`` to stay
quick. A failure must print exactly one ``error: …`` line, exit non-zero, and leave no
half-written image.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import candle_nn as cn
import numpy as np
import pytest
from conftest import error_line, fixture_dir
from PIL import Image

import candle_nn_models.scripts.yolo_v8 as cli
import candle_nn_models.scripts.yolo_v8_weights as yolo_v8_weights
from candle_nn_models.scripts.run_manifest import MANIFEST
from candle_nn_models.yolo_v8 import YoloV8


@pytest.fixture(scope="module")
def paths():
    return {"bike": fixture_dir("images") / "bike.jpg",
            "detect": fixture_dir("yolov8n") / "weights.safetensors",
            "pose": fixture_dir("yolov8n_pose") / "weights.safetensors",
            "resnet": fixture_dir("resnet18") / "weights.safetensors"}


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def images_in(folder: Path) -> list[Path]:
    """The files a run wrote (its run folder's file list aside)."""
    return sorted(p for p in folder.iterdir() if p.name != MANIFEST) if folder.exists() else []


def test_detect_writes_an_annotated_image(capsys, paths, tmp_path) -> None:
    code, out, err = run(capsys, "--image", paths["bike"], "--weights", paths["detect"],
                         "--out", tmp_path, "--size", 320)
    assert code == 0 and err == ""
    written = tmp_path / "bike_detect.jpg"
    assert images_in(tmp_path) == [written]
    with Image.open(written) as img:
        assert img.size == (800, 556) and img.format == "JPEG"
        drawn = np.asarray(img.convert("RGB"), dtype=np.int16)
    lines = out.strip().splitlines()
    count = int(lines[0].split(", ")[1].split()[0])
    assert lines[0].startswith(f"{paths['bike']}: 800x556, ") and f"-> {written}" in lines[0]
    assert count > 0 and len(lines) == 1 + count
    original = np.asarray(Image.open(paths["bike"]).convert("RGB"), dtype=np.int16)
    assert np.abs(drawn - original).mean() > 5  # boxes and labels were drawn


def test_pose_json(capsys, paths, tmp_path) -> None:
    code, out, err = run(capsys, "--image", paths["bike"], "--weights", paths["pose"],
                         "--task", "pose", "--out", tmp_path, "--size", 320, "--json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert doc["model"] == "YOLOv8n-pose (1 class, 17 keypoints)" and doc["task"] == "pose"
    (image,) = doc["images"]
    assert image["output"] == str(tmp_path / "bike_pose.jpg") and Path(image["output"]).is_file()
    assert (image["width"], image["height"]) == (800, 556)
    assert image["detections"]
    for det in image["detections"]:
        assert det["class_name"] == "person" and 0.25 < det["score"] <= 1
        x1, y1, x2, y2 = det["box_xyxy"]
        assert 0 <= x1 <= x2 <= 800 and 0 <= y1 <= y2 <= 556
        kpts = np.array(det["keypoints"])
        assert kpts.shape == (17, 3)
        assert (kpts[:, 0] <= 800).all() and (kpts[:, 1] <= 556).all() and (kpts >= 0).all()


def test_folder_and_repeated_images_get_distinct_outputs(capsys, paths, tmp_path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(paths["bike"], folder / "bike.jpg")
    Image.open(paths["bike"]).resize((200, 139)).save(folder / "small.png")
    (folder / "notes.txt").write_text("not an image, and not picked up from the folder")
    out_dir = tmp_path / "out"
    code, out, _ = run(capsys, "--image", folder, "--image", paths["bike"],
                       "--weights", paths["detect"], "--out", out_dir, "--size", 320, "--square")
    assert code == 0
    assert [p.name for p in images_in(out_dir)] == ["bike-2_detect.jpg", "bike_detect.jpg",
                                                     "small_detect.png"]
    with Image.open(out_dir / "small_detect.png") as img:
        assert img.size == (200, 139)


def test_zero_detections_still_write_the_image(capsys, paths, tmp_path) -> None:
    code, out, err = run(capsys, "--image", paths["bike"], "--weights", paths["detect"],
                         "--out", tmp_path, "--size", 320, "--conf", 1, "--json")
    assert code == 0 and err == ""
    assert json.loads(out)["images"][0]["detections"] == []
    # Nothing drawn: the file is the original re-encoded with the same JPEG settings.
    reencoded = io.BytesIO()
    Image.open(paths["bike"]).convert("RGB").save(reencoded, format="JPEG", quality=95)
    assert (tmp_path / "bike_detect.jpg").read_bytes() == reencoded.getvalue()


def test_missing_image(capsys, paths, tmp_path) -> None:
    code, out, err = run(capsys, "--image", tmp_path / "nope.jpg", "--weights", paths["detect"],
                         "--out", tmp_path / "out")
    assert code == 1
    error_line(err, "image not found", "nope.jpg")
    assert out == "" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", [b"this is not a JPEG", "truncated"])
def test_corrupt_image(capsys, paths, tmp_path, content) -> None:
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(paths["bike"].read_bytes()[:5000] if content == "truncated" else content)
    code, _, err = run(capsys, "--image", bad, "--weights", paths["detect"],
                       "--out", tmp_path / "out", "--size", 320)
    assert code == 1
    error_line(err, "bad.jpg", "not a readable image")
    assert images_in(tmp_path / "out") == []


def test_wrong_variant_for_the_weights(capsys, paths, tmp_path) -> None:
    code, _, err = run(capsys, "--image", paths["bike"], "--weights", paths["detect"],
                       "--variant", "s", "--out", tmp_path)
    assert code == 1
    error_line(err, "holds YOLOv8n (80 classes)", "--variant s")
    assert images_in(tmp_path) == []


def test_wrong_task_for_the_weights(capsys, paths, tmp_path) -> None:
    code, _, err = run(capsys, "--image", paths["bike"], "--weights", paths["detect"],
                       "--task", "pose", "--out", tmp_path)
    assert code == 1
    error_line(err, "holds YOLOv8n (80 classes)", "--task pose")
    code, _, err = run(capsys, "--image", paths["bike"], "--weights", paths["pose"],
                       "--task", "detect", "--out", tmp_path)
    assert code == 1
    error_line(err, "YOLOv8n-pose", "--task detect")
    assert images_in(tmp_path) == []


def test_weights_of_another_model(capsys, paths, tmp_path) -> None:
    code, _, err = run(capsys, "--image", paths["bike"], "--weights", paths["resnet"],
                       "--out", tmp_path)
    assert code == 1
    error_line(err, "not a YOLOv8 checkpoint", "resnet18")
    code, _, err = run(capsys, "--image", paths["bike"], "--weights", tmp_path / "none.safetensors",
                       "--out", tmp_path)
    assert code == 1
    error_line(err, "weights file not found")


def test_unwritable_output_folder(capsys, paths, tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out, err = run(capsys, "--image", paths["bike"], "--weights", paths["detect"],
                         "--out", blocker / "out")
    assert code == 1
    error_line(err, "cannot create output folder")
    assert out == ""


def test_failed_write_leaves_no_partial_image(capsys, paths, tmp_path, monkeypatch) -> None:
    class DiskFull:
        def save(self, fh, format=None, **options):
            fh.write(b"\xff\xd8 half a JPEG")
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli, "draw_detections", lambda *args, **kwargs: DiskFull())
    code, out, err = run(capsys, "--image", paths["bike"], "--weights", paths["detect"],
                         "--out", tmp_path, "--size", 320)
    assert code == 1
    error_line(err, "cannot write", "bike_detect.jpg", "No space left")
    assert images_in(tmp_path) == [] and out == ""


def test_default_weights_follow_task_and_variant(capsys, paths, tmp_path, monkeypatch) -> None:
    asked = []

    def fake_resolve(model, variant, path=None):
        asked.append((model, variant, path))
        return paths["pose"]

    monkeypatch.setattr(yolo_v8_weights, "resolve_weights", fake_resolve)
    code, _, _ = run(capsys, "--image", paths["bike"], "--task", "pose", "--out", tmp_path,
                     "--size", 320, "--conf", 1)
    assert code == 0 and asked == [("yolo_v8_pose", "n", None)]
    code, _, err = run(capsys, "--image", paths["bike"], "--variant", "m", "--out", tmp_path)
    assert asked[-1] == ("yolo_v8", "m", None)
    assert code == 1
    error_line(err, "YOLOv8n-pose", "--task detect --variant m")


def test_class_names_from_the_weights_metadata(capsys, paths, tmp_path) -> None:
    varmap = cn.VarMap()
    YoloV8.load(cn.VarBuilder.from_varmap(varmap, device="cpu", seed=5), "n", num_classes=2)
    weights = tmp_path / "pets.safetensors"
    varmap.save(weights, metadata={"candle_nn.names": json.dumps(["cat", "dog"])})
    code, out, _ = run(capsys, "--image", paths["bike"], "--weights", weights, "--out",
                       tmp_path / "out", "--size", 64, "--conf", 0, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["model"] == "YOLOv8n (2 classes)"
    names = {d["class_name"] for d in doc["images"][0]["detections"]}
    assert names and names <= {"cat", "dog"}


HOSTILE_NAMES = ["\x1b[31mcat\nFAKE: 99.00%", "dog\r\u202e\x07"]  # escapes, lines, bidi, bell


def test_class_names_with_control_characters_are_escaped_in_text(capsys, paths, tmp_path) -> None:
    """Class names from a file's metadata holding a colour escape, a newline, a carriage return,
    a bidirectional override and a bell reach the terminal escaped, one line per detection; the
    JSON document keeps them exact."""
    varmap = cn.VarMap()
    YoloV8.load(cn.VarBuilder.from_varmap(varmap, device="cpu", seed=5), "n", num_classes=2)
    weights = tmp_path / "hostile.safetensors"
    varmap.save(weights, metadata={"candle_nn.names": json.dumps(HOSTILE_NAMES)})
    args = ["--image", paths["bike"], "--weights", weights, "--size", 64, "--conf", 0]
    code, out, err = run(capsys, *args, "--out", tmp_path / "text")
    assert code == 0, err
    lines = out.splitlines()
    count = int(lines[0].split(", ")[1].split()[0])
    assert count > 0 and len(lines) == 1 + count, out
    assert all(line.isprintable() for line in lines), out
    shown = {line[2:].split("  [")[0].rsplit(" ", 1)[0].rstrip() for line in lines[1:]}
    assert shown <= {"\\x1b[31mcat\\nFAKE: 99.00%", "dog\\r\\u202e\\x07"}, shown
    code, out, _ = run(capsys, *args, "--out", tmp_path / "json", "--json")
    names = {d["class_name"] for d in json.loads(out)["images"][0]["detections"]}
    assert code == 0 and names and names <= set(HOSTILE_NAMES)


def test_bad_option_values_are_usage_errors(paths) -> None:
    for argv in (["--size", "100"], ["--conf", "1.5"], ["--task", "obb"], ["--top-k", "0"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(["--image", str(paths["bike"]), *argv])
        assert exc.value.code == 2
