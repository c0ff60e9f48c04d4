"""``candle-yolo-v8 val`` (and ``YOLO.val``, the API it is a client of) and the data.yaml /
YOLO-label reader, in-process on a two-image set made from the fixture photo (the fixture's
seeded weights; labels placed on some of the model's own detections, clipped to the image, so
some are found)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import candle_nn as cn
import mlx.core as mx
from candle_nn_models.coco import coco_class_names
from candle_nn_models.letterbox import letterbox
from candle_nn_models.scripts.yolo_v8 import main
from candle_nn_models.scripts.yolo_v8_weights import load_detector
from candle_nn_models.scripts.yolo_v8_val import detections, ground_truth_in_input
from candle_nn_models.yolo_v8_data import DataConfig, DataError, label_path, read_labels
from candle_nn_models.yolo_v8_metrics import DetectionMetrics
from conftest import error_line, fixture_dir

SIZE = 320


@pytest.fixture(scope="module")
def weights():
    return fixture_dir("yolov8n") / "weights.safetensors"


def _write_yaml(root, names=None, **entries) -> str:
    names = list(coco_class_names()) if names is None else names
    lines = [f"path: {root}"] + [f"{k}: {v}" for k, v in entries.items()] + ["names:"]
    lines += [f"  {i}: '{n}'" for i, n in enumerate(names)]
    (root / "data.yaml").write_text("\n".join(lines) + "\n")
    return str(root / "data.yaml")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, weights):
    """``(data.yaml, expected metrics dict)``: bike.jpg and its mirror, labelled with three of the
    model's detections of each, clipped to the image (written as YOLO lines, plus a repeated and
    a bad line), and a corrupt image; the expectation scores the model's detections directly."""
    root = tmp_path_factory.mktemp("shapes")
    (root / "images" / "val").mkdir(parents=True)
    (root / "labels" / "val").mkdir(parents=True)
    photo = Image.open(fixture_dir("images") / "bike.jpg").convert("RGB")
    photo.save(root / "images" / "val" / "a.png")
    photo.transpose(Image.FLIP_LEFT_RIGHT).save(root / "images" / "val" / "b.png")
    (root / "images" / "val" / "broken.jpg").write_bytes(b"not a jpeg")
    model, _, _, _ = load_detector(weights, "detect", None, cn.Device.cpu())
    expected = DetectionMetrics(list(coco_class_names()))
    for name in ("a", "b"):
        rgb = np.asarray(Image.open(root / "images" / "val" / f"{name}.png"))
        lb = letterbox(rgb, SIZE)
        pred = np.array(model(mx.array(lb.as_input())))[0]
        boxes, scores, classes = detections(pred, 80, 0.001, 0.7, 300)
        h, w = rgb.shape[:2]
        orig = lb.to_original(boxes)  # clipped to the image, as labels are
        chosen = [0, 5, 10]
        lines = [f"{classes[i]} {(orig[i, 0] + orig[i, 2]) / 2 / w:.6f} "
                 f"{(orig[i, 1] + orig[i, 3]) / 2 / h:.6f} {(orig[i, 2] - orig[i, 0]) / w:.6f} "
                 f"{(orig[i, 3] - orig[i, 1]) / h:.6f}" for i in chosen]
        if name == "a":
            lines += [lines[0], "5 0.5 0.5 1.5 0.2"]  # a repeat and an out-of-range box
        (root / "labels" / "val" / f"{name}.txt").write_text("\n".join(lines) + "\n")
        labels, _ = read_labels(root / "labels" / "val" / f"{name}.txt", 80)
        gt = ground_truth_in_input(lb, labels.xyxy(w, h))
        expected.update(boxes, scores, classes, gt, labels.classes)
    return _write_yaml(root, val="images/val"), expected.results().to_dict()


def test_val_json_is_the_metrics_of_the_detections(capsys, dataset, weights) -> None:
    yaml_path, expected = dataset
    code = main(["val", "--data", yaml_path, "--weights", str(weights), "--imgsz", str(SIZE),
                 "--batch", "2", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = json.loads(out)
    assert got["split"] == "val" and got["all"]["images"] == 2 and got["all"]["instances"] == 6
    assert [c["class"] for c in got["classes"]] == [c["class"] for c in expected["classes"]]
    for mine, ref in zip([got["all"], *got["classes"]], [expected["all"], *expected["classes"]]):
        for key in ("precision", "recall", "mAP50", "mAP50-95"):
            assert mine[key] == pytest.approx(ref[key], abs=1e-6), (mine["class"], key)
    assert got["all"]["mAP50"] > 0 and got["all"]["recall"] > 0  # labels were found
    warnings = err.strip().splitlines()
    assert len(warnings) == 3, err
    assert any("broken.jpg" in w and "skipped" in w for w in warnings)
    assert any("a.txt:4: repeats" in w for w in warnings)
    assert any("a.txt:5: coordinates outside 0..1" in w for w in warnings)


def test_yolo_val_is_the_cli_json(capsys, dataset, weights) -> None:
    """``yolo.load(weights).val(data=...)`` gives exactly the metrics ``candle-yolo-v8 val
    --json`` prints, and hands each warning the CLI prints to ``warn``."""
    from candle_nn_models import yolo

    yaml_path, _ = dataset
    assert main(["val", "--data", yaml_path, "--weights", str(weights), "--imgsz", str(SIZE),
                 "--batch", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    cli = json.loads(out)
    warnings: list[str] = []
    results = yolo.load(weights, "cpu").val(data=yaml_path, imgsz=SIZE, batch=2,
                                            warn=warnings.append)
    assert json.loads(json.dumps(results.to_dict())) == {
        k: v for k, v in cli.items() if k not in ("data", "split")}
    assert [f"warning: {w}" for w in warnings] == err.strip().splitlines()
    assert results.all.images == 2 and results.all.map50 > 0


def test_yolo_val_bad_input_is_one_candle_nn_error(tmp_path, dataset, weights) -> None:
    from candle_nn_models import yolo

    yaml_path, _ = dataset
    model = yolo.load(weights, "cpu")
    pose = yolo.load(fixture_dir("yolov8n_pose") / "weights.safetensors", "cpu")
    for call, fragments in [
            (lambda: model.val(tmp_path / "none.yaml"), ("none.yaml", "not found")),
            (lambda: model.val(yaml_path, split="test"), ("no 'test' entry",)),
            (lambda: model.val(yaml_path, batch=0), ("batch=0", ">= 1")),
            (lambda: model.val(yaml_path, conf=2), ("conf=2", "[0, 1]")),
            (lambda: model.val(yaml_path, imgsz=100), ("imgsz=100", "multiple of 32")),
            (lambda: pose.val(yaml_path), ("val scores detectors",))]:
        with pytest.raises(cn.CandleNNError) as info:
            call()
        assert "\n" not in str(info.value)
        for fragment in fragments:
            assert fragment in str(info.value), str(info.value)


def test_val_prints_ultralytics_table(capsys, dataset, weights) -> None:
    yaml_path, expected = dataset
    assert main(["val", "--data", yaml_path, "--weights", str(weights), "--imgsz",
                 str(SIZE)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["Class", "Images", "Instances", "Box(P", "R", "mAP50", "mAP50-95)"]
    first = lines[1].split()
    assert first[:3] == ["all", "2", "6"]
    assert float(first[5]) == pytest.approx(expected["all"]["mAP50"], rel=2e-3)
    assert len(lines) == 2 + len(expected["classes"])


def test_val_errors_are_one_line(capsys, tmp_path, weights) -> None:
    w = str(weights)
    assert main(["val", "--data", str(tmp_path / "none.yaml"), "--weights", w]) == 1
    error_line(capsys.readouterr().err, "none.yaml", "not found")
    (tmp_path / "images").mkdir()
    small = _write_yaml(tmp_path, names=["cat", "dog"], val="images")
    assert main(["val", "--data", small, "--weights", w]) == 1
    error_line(capsys.readouterr().err, "no images in val")
    Image.new("RGB", (64, 48)).save(tmp_path / "images" / "x.png")
    assert main(["val", "--data", small, "--weights", w]) == 1
    error_line(capsys.readouterr().err, "2 classes", "predicts 80")
    assert main(["val", "--data", small, "--weights", w, "--split", "test"]) == 1
    error_line(capsys.readouterr().err, "no 'test' entry")
    with pytest.raises(SystemExit) as exit_:
        main(["val", "--data", small, "--imgsz", "100"])
    assert exit_.value.code == 2


def test_data_yaml_forms(tmp_path) -> None:
    (tmp_path / "imgs").mkdir()
    for name in ("x.jpg", "y.png", "notes.md"):
        (tmp_path / "imgs" / name).write_bytes(b"")
    (tmp_path / "list.txt").write_text("imgs/x.jpg\n\n./imgs/y.png\n")
    (tmp_path / "d.yaml").write_text("train: list.txt\nval: [imgs]\nnames: {0: a, 1: b}\nnc: 2\n")
    data = DataConfig.load(tmp_path / "d.yaml")
    assert data.names == ["a", "b"]
    assert [p.name for p in data.images("train")] == ["x.jpg", "y.png"]
    assert [p.name for p in data.images("val")] == ["x.jpg", "y.png"]
    (tmp_path / "bad.yaml").write_text("val: imgs\nnames: [a]\nnc: 3\n")
    with pytest.raises(DataError, match="nc is 3"):
        DataConfig.load(tmp_path / "bad.yaml")
    assert label_path("/d/images/train/images/p.jpg").as_posix() == "/d/images/train/labels/p.txt"


@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), "is a folder, not a data.yaml file"),
    (lambda p: p.write_bytes(b"\xff\xd8\xff\xe0 JFIF"), "not a text (YAML) file"),
])
def test_data_that_is_no_yaml_file_is_one_plain_message(tmp_path, make, message) -> None:
    """A folder or an image given to --data: what it is and what to pass, no errno or codec
    text."""
    path = tmp_path / "data"
    make(path)
    with pytest.raises(DataError) as err:
        DataConfig.load(path)
    assert str(err.value) == (f"{path}: {message} (pass the data set's YAML: path, train, val, "
                              "names)")


def test_label_lines(tmp_path) -> None:
    path = tmp_path / "l.txt"
    path.write_text("0 0.5 0.5 0.2 0.4\n"
                    "1 0.1 0.1 0.3 0.1 0.2 0.5\n"  # a polygon: its bounding box
                    "\n"
                    "2 0.5 0.5 0.1\n"  # too few values
                    "7 0.5 0.5 0.1 0.1\n"  # class out of range
                    "x 0.5 0.5 0.1 0.1\n"
                    "0 0.5 0.5 0.0 0.1\n")
    labels, warnings = read_labels(path, 3)
    assert labels.classes.tolist() == [0, 1]
    np.testing.assert_allclose(labels.boxes, [[0.5, 0.5, 0.2, 0.4], [0.2, 0.3, 0.2, 0.4]],
                               atol=1e-7)
    assert [w.split(": ")[0].rsplit(":", 1)[1] for w in warnings] == ["4", "5", "6", "7"]
    assert read_labels(tmp_path / "missing.txt", 3)[1] == []


def test_help_names_shared_options_as_train_does():
    """``val --help`` and ``train --help`` show each option they share with the same metavar
    (``--weights FILE``, ``--imgsz PX``, ``--batch N``, ...)."""
    from candle_nn_models.scripts import yolo_v8_train, yolo_v8_val

    def metavars(parser):
        return {a.option_strings[-1]: a.metavar for a in parser._actions if a.option_strings}

    train, val = metavars(yolo_v8_train.build_parser()), metavars(yolo_v8_val.build_parser())
    shared = sorted(set(train) & set(val) - {"--help"})
    assert {"--data", "--weights", "--variant", "--imgsz", "--batch", "--device"} <= set(shared)
    assert {k: val[k] for k in shared} == {k: train[k] for k in shared}
    assert val["--max-det"] == "N"  # counts are N in both commands
