"""``candle-yolo-v8 train`` end to end on a generated shapes data set (helpers/shapes_dataset.py),
fine-tuning yolov8n from the fixture weights with a new class count (3):

* learning: seed 0, 96 training / 32 validation images drawn at 128 px, trained at 64 px, batch
  16 with ``--nbs 16`` (one optimizer step a batch), no warm-up, no mosaic, ``--freeze-bn``,
  ultralytics' ``auto`` optimizer (AdamW, lr 0.001429), 10 epochs = 60 steps: the best
  validation mAP50 reaches ``MIN_MAP50``;
* ``--resume`` after a stop ends bit-identical to an uninterrupted run;
* two processes under ``mlx.launch --backend ring`` train like one on the whole batch;
* bad arguments and data: one ``error:`` line, no traceback.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from helpers.cli import cli_command, cli_env, run_cli
from helpers.shapes_dataset import make_shapes
from conftest import FIXTURES, error_line

WEIGHTS = FIXTURES / "yolov8n" / "weights.safetensors"
MIN_MAP50 = 0.1  # the run reaches 0.242 (epoch 10); 0.000 before training


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
    # best.safetensors is the epoch of the best fitness, ultralytics' DetMetrics.fitness: mAP50-95
    best_fitness = json.loads(result.stdout)["best_fitness"]
    assert best_fitness == pytest.approx(max(float(r["metrics/mAP50-95(B)"]) for r in rows),
                                         rel=1e-5)
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
    for name in ("last.safetensors", "best.safetensors", "checkpoint.safetensors"):
        a = mx.load(str(whole / "weights" / name))
        b = mx.load(str(parts / "weights" / name))
        assert set(a) == set(b)
        for key in a:  # bit-identical: model, EMA, optimizer state, the pending gradient sum
            np.testing.assert_array_equal(np.array(a[key]), np.array(b[key]),
                                          err_msg=f"{name}: {key}")
    whole_rows, part_rows = _rows(whole), _rows(parts)
    for row in (*whole_rows, *part_rows):
        row.pop("time")
    assert whole_rows == part_rows


def test_two_processes_train_like_one_on_the_whole_batch(tmp_path):
    """``mlx.launch -n 2 --backend ring``: each rank runs 4 of each batch's 8 images (the last
    batch: 2 of 4), the loss is normalised over the whole batch and the gradients summed; with
    BatchNorm statistics frozen the model and EMA after 2 epochs (warm-up, mosaic, then
    without, SGD, accumulation over 2 batches) equal one process's within float32 rounding
    (rtol 1e-4, atol 1e-6), and so do the logged losses."""
    data = make_shapes(tmp_path / "shapes", n_train=20, n_val=4, size=64, seed=2)
    options = ["--data", data, "--weights", WEIGHTS, "--imgsz", "64", "--device", "cpu",
               "--no-progress", "--workers", "2", "--epochs", "2", "--batch", "8", "--nbs",
               "16", "--close-mosaic", "1", "--optimizer", "SGD", "--freeze-bn", "--seed", "3"]
    one = run_cli("yolo", "train", *options, "--out", tmp_path / "one", timeout=600)
    assert one.returncode == 0, one.stderr.decode()[-2000:]
    launcher = Path(sys.executable).with_name("mlx.launch")
    two = subprocess.run([str(launcher), "-n", "2", "--backend", "ring", "--",
                          *cli_command("yolo", "train", *options, "--out", tmp_path / "two")],
                         capture_output=True, timeout=600, env=cli_env())
    log = (two.stdout + two.stderr).decode()
    assert two.returncode == 0, log[-3000:]
    assert "2 processes" in log and log.count("epoch 2/2:") == 1  # rank 0 alone logs
    a = mx.load(str(tmp_path / "one/weights/checkpoint.safetensors"))
    b = mx.load(str(tmp_path / "two/weights/checkpoint.safetensors"))
    keys = [k for k in a if k.startswith(("model/", "ema/"))]
    assert len(keys) > 400 and set(keys) <= set(b)
    worst = 0.0
    for key in keys:
        x, y = np.array(a[key]), np.array(b[key])
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-6, err_msg=key)
        worst = max(worst, float(np.abs(y - x).max() / max(np.abs(x).max(), 1e-12)))
    print(f"2 ranks vs 1: max |difference| / max |value| per tensor: {worst:.2e}")
    for row_one, row_two in zip(_rows(tmp_path / "one"), _rows(tmp_path / "two"), strict=True):
        for column in ("train/box_loss", "train/cls_loss", "train/dfl_loss"):
            np.testing.assert_allclose(float(row_two[column]), float(row_one[column]),
                                       rtol=1e-4)


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


def _files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished 1-epoch run on 4 images at 64 px: ``(data.yaml, run folder)``."""
    root = tmp_path_factory.mktemp("tiny")
    data = make_shapes(root / "shapes", n_train=4, n_val=2, size=64, seed=4)
    run = root / "run"
    done = _train(data, run, "--epochs", "1", "--batch", "2", "--freeze-bn")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    # stdout: one JSON line, the run's summary (as candle-resnet train's)
    summary = json.loads(done.stdout)
    assert summary == {"run": str(run), "epochs_done": 1,
                       "best": str(run / "weights/best.safetensors"),
                       "best_fitness": summary["best_fitness"]}
    return data, run


def test_a_finished_run_is_never_overwritten(tiny_run):
    """``--out`` naming a finished run is one error line; its weights and files stay as they
    were (also once its checkpoint is gone)."""
    data, run = tiny_run
    before = _files_of(run)
    assert "weights/best.safetensors" in before
    again = _train(data, run, "--epochs", "1", "--batch", "2", "--freeze-bn")
    assert again.returncode == 1
    error_line(again.stderr, "already holds a run", "weights/best.safetensors", "another --out")
    assert _files_of(run) == before


def test_a_second_training_into_the_same_out_is_refused(tiny_run, tmp_path):
    """While a training holds the run folder (its lock), another one into it is one error line
    naming the holder, and writes nothing."""
    from candle_nn_models.scripts.folder_lock import hold

    data, _ = tiny_run
    out = tmp_path / "run"
    out.mkdir()
    with hold(out, "train.lock", "candle-yolo-v8 train", "--out", what="run"):
        before = _files_of(out)
        second = _train(data, out, "--epochs", "1", "--batch", "2", "--freeze-bn")
        assert second.returncode == 1
        error_line(second.stderr, f"another candle-yolo-v8 train run is writing to {out}",
                   f"pid {os.getpid()}", "another --out")
        assert _files_of(out) == before


def test_unwritable_out_is_one_error_line(tiny_run, tmp_path):
    data, _ = tiny_run
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = _train(data, blocker / "run", "--epochs", "1", "--batch", "2", "--freeze-bn")
    assert result.returncode == 1
    error_line(result.stderr, "cannot create", str(blocker / "run"), "another --out")
    assert blocker.read_text() == ""


def test_resume_of_a_finished_run_is_refused(tiny_run):
    """As ultralytics ("nothing to resume") and ``candle-resnet train``: exit 1, one error line,
    the run's files unchanged."""
    _, run = tiny_run
    before = _files_of(run)
    again = run_cli("yolo", "train", "--resume", "--out", run, "--device", "cpu",
                    "--no-progress")
    assert again.returncode == 1
    error_line(again.stderr, "already finished its 1 epochs", "nothing to resume")
    assert _files_of(run) == before


def test_divergence_stops_with_one_error_line(tiny_run, tmp_path):
    """``--lr0 1e30``: the loss or the weights stop being finite; the run stops with one error
    line naming --lr0, exit 1, and no weights file is written."""
    data, _ = tiny_run
    out = tmp_path / "run"
    result = _train(data, out, "--epochs", "2", "--batch", "2", "--nbs", "2", "--freeze-bn",
                    "--optimizer", "SGD", "--lr0", "1e30", "--warmup-epochs", "0")
    assert result.returncode == 1
    err = result.stderr.decode()
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "diverged" in errors[0] and "--lr0" in errors[0], err
    assert not list(out.rglob("*.safetensors"))


@pytest.mark.parametrize("state", [None, {"format": 1}])
def test_resume_of_a_file_that_is_not_a_training_checkpoint(tmp_path, state):
    """A weights file (no training state) or a state without the run's fields, as the run's
    checkpoint: one error line saying what the file is, no KeyError; nothing changes."""
    out = tmp_path / "run"
    (out / "weights").mkdir(parents=True)
    meta = {} if state is None else {"candle_nn.yolo_train_state": json.dumps(state)}
    mx.save_safetensors(str(out / "weights/checkpoint.safetensors"), mx.load(str(WEIGHTS)),
                        metadata=meta)
    before = _files_of(out)
    result = run_cli("yolo", "train", "--resume", "--out", out)
    assert result.returncode == 1
    line = error_line(result.stderr, "checkpoint.safetensors", "is not a", "without --resume")
    assert "KeyError" not in line and "'candle_nn.yolo_train_state'" not in line
    assert _files_of(out) == before


@pytest.mark.parametrize("batch, imgsz, batches", [
    (16, 64, 1),  # more than the 4 training images: one batch of all of them
    (1, 64, 4),  # one image a batch: BatchNorm normalises over its 2x2 last feature map
])
def test_batch_edges_train_as_ultralytics(tiny_run, tmp_path, batch, imgsz, batches):
    """As ultralytics (and ``candle-resnet train``, tested the same way): a batch larger than
    the training set trains on batches of the whole set, with one warning; ``--batch 1`` trains
    when each BatchNorm still sees 2 values a channel, else it is one error line."""
    data, _ = tiny_run
    out = tmp_path / "run"
    result = run_cli("yolo", "train", "--data", data, "--weights", WEIGHTS, "--imgsz", imgsz,
                     "--out", out, "--device", "cpu", "--no-progress", "--workers", "2",
                     "--batch", batch, "--epochs", "1")
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    err = result.stderr.decode()
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == ([f"warning: --batch {batch} is more than the 4 training images; "
                         "each batch takes all 4"] if batch > 4 else []), err
    assert f"{batches} batches per epoch" in err
    assert (out / "weights/best.safetensors").is_file()
    too_small = _train(data, tmp_path / "small", "--imgsz", "32", "--batch", "1", "--epochs", "1")
    assert too_small.returncode == 1
    error_line(too_small.stderr, "--batch 1", "--imgsz 32", "--freeze-bn")
