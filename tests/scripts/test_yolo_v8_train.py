"""``candle-yolo-v8 train`` end to end on a generated shapes data set (helpers/shapes_dataset.py),
fine-tuning yolov8n from the fixture weights with a new class count (3):

* learning: seed 0, 96 training / 32 validation images drawn at 128 px, trained at 64 px, batch
  16 with ``--nbs 16`` (one optimizer step a batch), no warm-up, no mosaic, ``--freeze-bn``,
  ultralytics' ``auto`` optimizer (AdamW, lr 0.001429), 10 epochs = 60 steps: the best
  validation mAP50 reaches ``MIN_MAP50``;
* ``--resume`` after a stop ends with the same weights as an uninterrupted run;
* bad arguments and data: one ``error:`` line, no traceback.
"""

from __future__ import annotations

import csv
import json

import mlx.core as mx
import numpy as np
import pytest

from helpers.cli import run_cli
from helpers.shapes_dataset import make_shapes
from conftest import FIXTURES

WEIGHTS = FIXTURES / "yolov8n" / "weights.safetensors"
MIN_MAP50 = 0.1  # the run reaches 0.185 (epoch 8); 0.000 before training
RESUME_RTOL_L2 = 1e-4


def _train(data, out, *extra, timeout=900):
    return run_cli("yolo", "train", "--data", data, "--weights", WEIGHTS, "--imgsz", "64",
                   "--out", out, "--device", "cpu", "--no-progress", "--workers", "2", *extra,
                   timeout=timeout)


def _rows(run):
    with open(run / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_fine_tuning_learns_shapes(tmp_path):
    data = make_shapes(tmp_path / "shapes", n_train=96, n_val=32, size=128, seed=0)
    run = tmp_path / "run"
    result = _train(data, run, "--epochs", "10", "--batch", "16", "--nbs", "16",
                    "--warmup-epochs", "0", "--close-mosaic", "10", "--freeze-bn", "--seed", "0")
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    rows = _rows(run)
    assert len(rows) == 10
    best = max(float(r["metrics/mAP50(B)"]) for r in rows)
    print(f"mAP50 per epoch: {[round(float(r['metrics/mAP50(B)']), 3) for r in rows]}")
    assert best >= MIN_MAP50
    assert float(rows[-1]["train/cls_loss"]) < float(rows[0]["train/cls_loss"])
    # best.safetensors is what `candle-yolo-v8 val` scores the same
    val = run_cli("yolo", "val", "--data", data, "--weights", run / "weights/best.safetensors",
                  "--imgsz", "64", "--device", "cpu", "--json")
    assert val.returncode == 0, val.stderr.decode()[-2000:]
    scored = json.loads(val.stdout)
    assert scored["all"]["mAP50"] >= MIN_MAP50
    assert [c["class"] for c in scored["classes"]] == ["square", "disc", "triangle"]
    assert (run / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_after_stop_matches_uninterrupted_run(tmp_path):
    data = make_shapes(tmp_path / "shapes", n_train=20, n_val=4, size=64, seed=1)
    # 3 batches an epoch, 2 batches a step: a step's gradients straddle the epoch boundary;
    # epoch 2 without mosaic; SGD momentum state
    options = ("--epochs", "2", "--batch", "8", "--nbs", "16", "--warmup-epochs", "0",
               "--close-mosaic", "1", "--optimizer", "SGD", "--lr0", "0.01", "--seed", "5")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert _train(data, whole, *options).returncode == 0
    first = _train(data, parts, *options, "--stop-after", "1")
    assert first.returncode == 0, first.stderr.decode()[-2000:]
    assert len(_rows(parts)) == 1
    second = run_cli("yolo", "train", "--resume", "--out", parts, "--device", "cpu",
                     "--no-progress")
    assert second.returncode == 0, second.stderr.decode()[-2000:]
    a = mx.load(str(whole / "weights/last.safetensors"))
    b = mx.load(str(parts / "weights/last.safetensors"))
    assert set(a) == set(b)
    # the same run to float32 rounding: MLX's CPU kernels do not promise bitwise-equal results
    # across processes, and a step's rounding spreads; a lost or repeated step, a reset
    # optimizer, EMA or gradient sum, or a different augmentation differs by orders more
    worst = max(float(np.linalg.norm(np.array(a[n]) - np.array(b[n]))
                      / max(np.linalg.norm(np.array(a[n])), 1e-12)) for n in a)
    print(f"resume vs uninterrupted: max relative L2 difference {worst:.2e}")
    assert worst < RESUME_RTOL_L2
    for whole_row, part_row in zip(_rows(whole), _rows(parts), strict=True):
        assert whole_row["epoch"] == part_row["epoch"]
        np.testing.assert_allclose(float(whole_row["train/box_loss"]),
                                   float(part_row["train/box_loss"]), rtol=1e-4)


@pytest.mark.parametrize("args, message", [
    (("--imgsz", "100"), "multiple of 32"),
    (("--optimizer", "adam"), "auto, SGD, AdamW"),
    (("--data", "missing.yaml"), "data file not found"),
    (("--resume", "--out", "nowhere"), "no checkpoint to resume"),
    (("--resume", "--out", "nowhere", "--epochs", "3"), "drop --epochs"),
])
def test_bad_arguments_one_error_line(tmp_path, args, message):
    result = run_cli("yolo", "train", *(a if a != "nowhere" else tmp_path / "nowhere"
                                        for a in args), cwd=tmp_path)
    err = result.stderr.decode()
    assert result.returncode != 0
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and message in lines[0], err


def test_unusable_data_one_error_line(tmp_path):
    data = make_shapes(tmp_path / "shapes", n_train=2, n_val=1, size=64)
    for image in (tmp_path / "shapes/images/val").iterdir():
        image.write_bytes(b"broken")
    result = _train(data, tmp_path / "run", "--epochs", "1")
    err = result.stderr.decode()
    assert result.returncode != 0 and "Traceback" not in err
    assert err.count("warning:") == 1 and "image skipped" in err
    assert [line for line in err.splitlines() if "error:" in line][0].endswith(
        "no usable images in val (see the warnings)")


def test_classifier_weights_are_one_error_line(tmp_path):
    import candle_nn as cn

    from candle_nn_models.yolo_v8 import YoloV8Cls

    data = make_shapes(tmp_path / "shapes", n_train=2, n_val=1, size=64)
    varmap = cn.VarMap()
    YoloV8Cls.load(cn.VarBuilder.from_varmap(varmap, seed=0, device="cpu"), "n", 3)
    varmap.save(tmp_path / "cls.safetensors")
    result = run_cli("yolo", "train", "--data", data, "--weights", tmp_path / "cls.safetensors",
                     "--imgsz", "64", "--out", tmp_path / "run", "--epochs", "1", cwd=tmp_path)
    err = result.stderr.decode()
    assert result.returncode != 0 and "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "YOLOv8n-cls (3 classes), a classifier" in lines[0], err
    assert not (tmp_path / "run").exists()
