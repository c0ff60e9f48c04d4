"""ultralytics-style YOLOv8 options: --classes, --max-det, --agnostic-nms (against a transcription
of ultralytics' ``non_max_suppression``), --save-txt/--save-conf (YOLO label format), --save-crop
(ultralytics' ``save_one_box`` geometry and naming), --half, --line-width/--hide-labels/--hide-conf.
"""

from __future__ import annotations

import json

import candle_nn as cn
import numpy as np
import pytest
from conftest import fixture_dir
from PIL import Image
from helpers.nms_reference import random_boxes, reference_nms

import candle_nn_models.scripts.yolo_v8 as cli
from candle_nn_models.letterbox import Letterbox
from candle_nn_models.yolo_v8_post import Detection, crop_box, postprocess, yolo_label_lines
from candle_nn_models.scripts.yolo_v8_draw import draw_detections

MAX_WH = 7680  # ultralytics' class offset: boxes of different classes never overlap


def ultralytics_nms(pred: np.ndarray, nc: int, conf: float, iou: float, classes, agnostic: bool,
                    max_det: int, max_nms: int = 30000) -> list[tuple[int, float, list[float]]]:
    """ultralytics' ``non_max_suppression`` (single label), step by step, for one image ``(C, A)``:
    best class > conf, class filter, top max_nms, NMS on class-offset boxes, first max_det."""
    x = pred.T
    best, score = x[:, 4:4 + nc].argmax(1), x[:, 4:4 + nc].max(1)
    rows = [(x[i, :4], float(score[i]), int(best[i])) for i in range(len(x)) if score[i] > conf]
    if classes is not None:
        rows = [r for r in rows if r[2] in classes]
    rows = sorted(rows, key=lambda r: -r[1])[:max_nms]  # stable: ties keep anchor order
    boxes = [[cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2] for (cx, cy, w, h), _, _ in rows]
    offset = [0 if agnostic else c * MAX_WH for _, _, c in rows]
    shifted = [[v + o for v in b] for b, o in zip(boxes, offset)]
    keep = reference_nms(shifted, [r[1] for r in rows], iou, [0] * len(rows))[:max_det]
    return [(rows[i][2], rows[i][1], boxes[i]) for i in keep]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("classes, agnostic, max_det", [
    (None, False, 300), ([1, 3], False, 300), ([0], False, 5), (None, True, 300),
    ([2, 4], True, 7), (None, False, 1)])
def test_postprocess_options_match_ultralytics(seed, classes, agnostic, max_det) -> None:
    nc = 5
    boxes, _, _ = random_boxes(400, nc, seed)
    rng = np.random.default_rng(seed + 10)
    scores = np.round(rng.uniform(0, 1, (400, nc)) ** 3, 3)
    xywh = np.concatenate([(boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2]], 1)
    pred = np.concatenate([xywh, scores], axis=1).astype(np.float32).T  # (4 + nc, A)
    lb = Letterbox(np.zeros((8, 8, 3), np.uint8), 1.0, (0, 0), (2000, 2000))  # identity
    got = postprocess(pred[None], [lb], num_classes=nc, conf=0.25, iou=0.45, max_det=max_det,
                      agnostic=agnostic, classes=classes)[0]
    want = ultralytics_nms(pred, nc, 0.25, 0.45, classes, agnostic, max_det)
    assert len(want) > 0
    assert [(d.class_id, round(d.score, 6)) for d in got] == [(c, round(s, 6)) for c, s, _ in want]
    clipped = np.clip([b for _, _, b in want], 0, 2000)  # ultralytics' scale_boxes clips too
    np.testing.assert_allclose([d.box_xyxy for d in got], clipped, atol=1e-3)


# --- --save-txt: YOLO label format -------------------------------------------------------------


def test_yolo_label_lines_are_ultralytics_format() -> None:
    """``class x_center y_center width height [conf]``, normalised by the image, ``%g``."""
    dets = [Detection(np.array([100, 50, 300, 250], np.float32), 0.875, 2),
            Detection(np.array([0, 0, 640, 480], np.float32), 0.5, 0)]
    assert yolo_label_lines(dets, (480, 640)) == ["2 0.3125 0.3125 0.3125 0.416667",
                                                  "0 0.5 0.5 1 1"]
    assert yolo_label_lines(dets, (480, 640), save_conf=True) == [
        "2 0.3125 0.3125 0.3125 0.416667 0.875", "0 0.5 0.5 1 1 0.5"]
    assert yolo_label_lines([], (480, 640)) == []


def test_yolo_label_lines_for_pose_append_keypoints_before_the_score() -> None:
    """ultralytics: ``... kx ky kv`` per keypoint (normalised; x, y zeroed below visibility 0.5)."""
    kpts = np.array([[320, 240, 0.9], [64, 48, 0.2]], np.float32)
    det = Detection(np.array([0, 0, 640, 480], np.float32), 0.75, 0, kpts)
    (line,) = yolo_label_lines([det], (480, 640), save_conf=True)
    assert line == "0 0.5 0.5 1 1 0.5 0.5 0.9 0 0 0.2 0.75"


# --- --save-crop: ultralytics' save_one_box ----------------------------------------------------


def test_crop_box_is_save_one_box() -> None:
    # 200 x 100 box centred at (200, 150): 200 * 1.02 + 10 = 214 wide, 112 high, truncated
    assert crop_box(np.array([100, 100, 300, 200]), (480, 640)) == (93, 94, 307, 206)
    # clipped to the image; truncation toward zero as torch's .long()
    assert crop_box(np.array([0.4, 0.4, 640, 480]), (480, 640)) == (0, 0, 640, 480)
    # centre 20.8, 30.25; 30.604 x 30.502 -> 5.498, 14.999, 36.102, 45.501
    assert crop_box(np.array([10.7, 20.2, 30.9, 40.3]), (480, 640)) == (5, 14, 36, 45)
    assert crop_box(np.array([1, 1, 21, 21]), (480, 640)) == (0, 0, 26, 26)  # -4.2 -> -4 -> 0


# --- drawing options ----------------------------------------------------------------------------


def _changed(img: Image.Image) -> np.ndarray:
    return (np.asarray(img) != 0).any(axis=2)


def test_line_width_hide_labels_hide_conf() -> None:
    black = np.zeros((200, 300, 3), np.uint8)
    det = [Detection(np.array([50, 80, 250, 180], np.float32), 0.9, 0)]
    thin = _changed(draw_detections(black, det, ["person"], line_width=1, labels=False))
    thick = _changed(draw_detections(black, det, ["person"], line_width=7, labels=False))
    # boxes only: the outline is exactly line_width pixels wide, nothing drawn outside it
    assert thin[130, 50] and not thin[130, 51] and thin[80, 150] and not thin[81, 150]
    assert thick[130, 50:57].all() and not thick[130, 57]
    assert not thick[:80].any() and not thick[181:].any()
    named = _changed(draw_detections(black, det, ["person"], line_width=1, scores=False))
    scored = _changed(draw_detections(black, det, ["person"], line_width=1))
    assert named[:80].any()  # a label above the box
    label_width = [np.ptp(np.flatnonzero(m[:80].any(axis=0))) for m in (named, scored)]
    assert label_width[0] < label_width[1]  # "person" is shorter than "person 0.90"


# --- the CLI ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def paths():
    return {"bike": fixture_dir("images") / "bike.jpg",
            "detect": fixture_dir("yolov8n") / "weights.safetensors",
            "pose": fixture_dir("yolov8n_pose") / "weights.safetensors"}


def run_json(capsys, paths, out, *argv) -> list[dict]:
    code = cli.main(["--image", str(paths["bike"]), "--weights", str(paths["detect"]), "--out",
                     str(out), "--exist-ok", "--size", "320", "--json", *map(str, argv)])
    stdout, err = capsys.readouterr()
    assert code == 0 and err == "", err
    return json.loads(stdout)["images"][0]["detections"]


def test_cli_save_txt_and_conf_agree_with_the_detections(capsys, paths, tmp_path) -> None:
    dets = run_json(capsys, paths, tmp_path, "--save-txt", "--save-conf")
    lines = (tmp_path / "labels" / "bike.txt").read_text().splitlines()
    assert len(lines) == len(dets) > 0
    for line, det in zip(lines, dets):
        cls, cx, cy, w, h, conf = (float(v) for v in line.split())
        x1, y1, x2, y2 = det["box_xyxy"]
        assert int(cls) == det["class_id"] and conf == pytest.approx(det["score"], abs=1e-4)
        np.testing.assert_allclose([cx, cy, w, h], [(x1 + x2) / 1600, (y1 + y2) / 1112,
                                                    (x2 - x1) / 800, (y2 - y1) / 556], atol=1e-4)
    plain = run_json(capsys, paths, tmp_path / "plain", "--save-txt")
    assert all(len(line.split()) == 5 for line in
               (tmp_path / "plain" / "labels" / "bike.txt").read_text().splitlines())
    assert plain == dets


def test_cli_save_txt_writes_no_file_without_detections(capsys, paths, tmp_path) -> None:
    assert run_json(capsys, paths, tmp_path, "--save-txt", "--conf", "1") == []
    assert not (tmp_path / "labels" / "bike.txt").exists()


def test_cli_pose_labels_carry_17_keypoints(capsys, paths, tmp_path) -> None:
    code = cli.main(["--image", str(paths["bike"]), "--weights", str(paths["pose"]), "--out",
                     str(tmp_path), "--size", "320", "--save-txt"])
    capsys.readouterr()
    lines = (tmp_path / "labels" / "bike.txt").read_text().splitlines()
    assert code == 0 and lines and all(len(line.split()) == 5 + 17 * 3 for line in lines)


def test_cli_save_crop_writes_one_crop_per_detection(capsys, paths, tmp_path) -> None:
    dets = run_json(capsys, paths, tmp_path, "--save-crop", "--max-det", 6)
    crops = sorted((tmp_path / "crops").rglob("*.jpg"))
    assert len(crops) == len(dets) == 6
    names = [d["class_name"] for d in dets]
    for name in set(names):  # ultralytics' increment_path naming: bike.jpg, bike2.jpg, ...
        expected = ["bike.jpg"] + [f"bike{n}.jpg" for n in range(2, names.count(name) + 1)]
        assert sorted(p.name for p in (tmp_path / "crops" / name).iterdir()) == sorted(expected)
    first = dets[0]
    x1, y1, x2, y2 = crop_box(np.array(first["box_xyxy"]), (556, 800))
    with Image.open(tmp_path / "crops" / first["class_name"] / "bike.jpg") as img:
        assert img.size == (x2 - x1, y2 - y1)


def test_cli_classes_max_det_and_agnostic_nms(capsys, paths, tmp_path) -> None:
    everything = run_json(capsys, paths, tmp_path, "--max-det", 30000)  # no cap: all classes
    some = sorted({d["class_id"] for d in everything})[:2]
    filtered = run_json(capsys, paths, tmp_path, "--classes", *some, "--max-det", 30000)
    # class-aware NMS never lets classes interact, so filtering = keeping those classes' rows
    assert filtered == [d for d in everything if d["class_id"] in some]
    assert run_json(capsys, paths, tmp_path, "--max-det", 3) == everything[:3]
    # on the CPU, like `want` below (a GPU's float32 differs in the 4th decimal of a score)
    agnostic = run_json(capsys, paths, tmp_path, "--agnostic-nms", "--device", "cpu")
    assert 0 < len(agnostic) < len(everything)
    # the flag reaches NMS: the same as postprocess(agnostic=True) on the model's prediction
    import mlx.core as mx

    from candle_nn_models.letterbox import letterbox
    from candle_nn_models.scripts.common import load_rgb
    model, spec, names, _ = cli.load_detector(paths["detect"], None, None, cn.Device.cpu())
    lb = letterbox(load_rgb(paths["bike"]), 320, auto=True)
    want = postprocess(model(mx.array(lb.as_input())), [lb], num_classes=80, iou=0.7,
                       agnostic=True)[0]  # the CLI's default --iou, ultralytics'
    assert agnostic == [d.to_dict(names) for d in want]


def test_cli_half_runs_in_float16_and_agrees(capsys, paths, tmp_path) -> None:
    full = run_json(capsys, paths, tmp_path, "--max-det", 5)
    half = run_json(capsys, paths, tmp_path, "--max-det", 5, "--half")
    assert [d["class_id"] for d in half] == [d["class_id"] for d in full]
    np.testing.assert_allclose([d["box_xyxy"] for d in half], [d["box_xyxy"] for d in full],
                               atol=4.0)  # pixels, on an 800x556 image
    np.testing.assert_allclose([d["score"] for d in half], [d["score"] for d in full], atol=0.01)


def test_cli_option_errors(capsys, paths, tmp_path) -> None:
    base = ["--image", str(paths["bike"]), "--weights", str(paths["detect"]), "--out",
            str(tmp_path / "o")]
    with pytest.raises(SystemExit) as exc:
        cli.main(base + ["--save-conf"])
    assert exc.value.code == 2
    assert "--save-conf only applies to --save-txt" in capsys.readouterr().err
    for bad in (["--max-det", "0"], ["--classes", "-1"], ["--line-width", "0"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(base + bad)
        assert exc.value.code == 2
    capsys.readouterr()
    assert cli.main(base + ["--classes", "80"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --classes 80: the model has 80 classes (0..79)"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv,message", [
    (["--conf", "abc"], "argument --conf: 'abc' is not a number"),
    (["--iou", "nan"], "argument --iou: 'nan' is not a finite number"),
    (["--max-det", "1.5"], "argument --max-det: '1.5' is not a whole number"),
    (["--classes", "x"], "argument --classes: 'x' is not a whole number"),
])
def test_bad_numbers_say_what_was_expected(capsys, argv, message):
    """The CLIs' one number check (scripts/common.number_arg), not argparse's message naming
    the checking function ("invalid _fraction value")."""
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--image", "a.jpg", *argv])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("option,value,message", [
    ("size", "100", "100 is not a positive multiple of 32"),
    ("size", "8192", "8192 is above 4096"),
    ("conf", "1.5", "1.5 is not in [0, 1]"),
    ("max-det", "0", "0 is not a positive whole number"),
])
def test_predict_val_and_train_check_numbers_alike(capsys, option, value, message):
    """predict, val and train share the checks of scripts/common (val and train call --size
    --imgsz; train has no --conf/--max-det)."""
    from candle_nn_models.scripts import yolo_v8_train, yolo_v8_val

    parsers = {"predict": (cli.build_parser(), ["--image", "a.jpg"], option),
               "val": (yolo_v8_val.build_parser(), ["--data", "d.yaml"],
                       "imgsz" if option == "size" else option)}
    if option == "size":
        parsers["train"] = (yolo_v8_train.build_parser(), ["--data", "d.yaml"], "imgsz")
    for parser, base, flag in parsers.values():
        with pytest.raises(SystemExit):
            parser.parse_args([*base, f"--{flag}", value])
        assert f"argument --{flag}: {message}" in capsys.readouterr().err
