"""``candle-nn-batch`` on a local Ray runtime (started once for the module, 2 CPUs): a folder of
~50 generated and fixture images with a few corrupt ones, through every model.

Checks: each image appears exactly once in the Parquet output, corrupt images become error rows,
a rerun after deleting (or truncating) a shard redoes that shard's images and nothing else, an
actor killed mid-batch loses and duplicates nothing, and the results equal the plain CLIs'
(``candle-resnet --json``, ``candle-yolo-v8 --square --json``) or ``SamPredictor``'s on the same
images, within the fixtures' tolerances. Also the message when the ``batch`` extra is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import candle_nn as cn
import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import error_line, fixture_dir, load_fixture
from PIL import Image

import candle_nn_models.scripts.batch as batch_cli

import ray  # not importorskip: without Ray these tests fail
CORRUPT = ("bad_garbage.jpg", "bad_truncated.jpg", "bad_empty.png")


@pytest.fixture(scope="module")
def ray_runtime():
    """One local Ray runtime for the module (Ray's start-up is the costly part)."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """bike.jpg, 46 generated images (PNG/JPEG, RGB/grey/RGBA, 48..200 px) and 3 corrupt."""
    root = tmp_path_factory.mktemp("images")
    shutil.copy(fixture_dir("images") / "bike.jpg", root / "bike.jpg")
    rng = np.random.default_rng(0)
    for i in range(46):
        h, w = int(rng.integers(48, 200)), int(rng.integers(48, 200))
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) % 256], axis=-1)
        rgb = np.clip(base + rng.integers(-40, 40, (h, w, 3)), 0, 255).astype(np.uint8)
        img = Image.fromarray(rgb)
        img = img.convert(("RGB", "L", "RGBA")[i % 3])
        img.save(root / f"gen{i:02d}.{'png' if i % 2 or img.mode == 'RGBA' else 'jpg'}")
    (root / "bad_garbage.jpg").write_bytes(rng.integers(0, 256, 2000, dtype=np.uint8).tobytes())
    (root / "bad_truncated.jpg").write_bytes((root / "bike.jpg").read_bytes()[:3000])
    (root / "bad_empty.png").write_bytes(b"")
    (root / "notes.txt").write_text("not an image: a folder lists images by suffix only\n")
    return root.resolve()


def images_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix != ".txt")


def good_images(folder: Path) -> list[Path]:
    return [p for p in images_of(folder) if p.name not in CORRUPT]


def weights(name: str) -> Path:
    return fixture_dir(name) / "weights.safetensors"


def run_batch(capsys, *argv) -> tuple[int, str, str]:
    code = batch_cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def read_rows(output: Path) -> list[dict]:
    return [row for shard in sorted(output.glob("*.parquet"))
            for row in pq.read_table(shard).to_pylist()]


def assert_complete(rows: list[dict], images: list[Path]) -> None:
    """Every image exactly once; the corrupt ones (only they) are error rows."""
    paths = [r["path"] for r in rows]
    assert len(paths) == len(set(paths)), "duplicate rows"
    assert sorted(paths) == sorted(str(p) for p in images)
    for row in rows:
        bad = Path(row["path"]).name in CORRUPT
        assert (row["error"] is not None) == bad, row
        if bad:
            assert row["path"] in row["error"] and row["width"] is None
        else:
            assert row["width"] > 0 and row["height"] > 0


@pytest.fixture(scope="module")
def resnet_job(ray_runtime, folder, tmp_path_factory):
    """The ResNet-18 job over the whole folder, shards of 8 rows: (output, stdout)."""
    output = tmp_path_factory.mktemp("resnet") / "out"
    code = batch_cli.main(["resnet", "--input", str(folder), "--output", str(output),
                           "--weights", str(weights("resnet18")), "--device", "cpu",
                           "--batch-size", "8", "--shard-rows", "8"])
    assert code == 0
    return output


def test_every_image_once_and_error_rows_for_corrupt_ones(resnet_job, folder):
    rows = read_rows(resnet_job)
    assert len(rows) == 50
    assert_complete(rows, images_of(folder))
    assert len(list(resnet_job.glob("*.parquet"))) >= 5  # ~8 rows a shard
    schema = pq.read_schema(next(resnet_job.glob("*.parquet")))
    assert schema.names == ["path", "width", "height", "error", "top_k"]
    bike = next(r for r in rows if r["path"].endswith("bike.jpg"))
    assert (bike["width"], bike["height"]) == (800, 556) and len(bike["top_k"]) == 5


def test_resnet_rows_equal_the_plain_cli(resnet_job, folder, capsys):
    import candle_nn_models.scripts.resnet as resnet_cli

    good = good_images(folder)
    argv = [a for p in good for a in ("--image", str(p))]
    assert resnet_cli.main([*argv, "--weights", str(weights("resnet18")), "--device", "cpu",
                            "--json"]) == 0
    cli = {d["image"]: d["top_k"] for d in json.loads(capsys.readouterr().out)["images"]}
    _, meta, _ = load_fixture("resnet18")
    tol = meta["tolerance"]["logits"]["rtol_of_max_abs"]  # probabilities: max |p| <= 1
    rows = {r["path"]: r["top_k"] for r in read_rows(resnet_job) if r["error"] is None}
    assert sorted(rows) == sorted(cli)
    worst = 0.0
    for path, expected in cli.items():
        got = rows[path]
        assert [t["label"] for t in got] == [t["label"] for t in expected], path
        assert [t["index"] for t in got] == [t["index"] for t in expected], path
        worst = max(worst, max(abs(a["probability"] - b["probability"])
                               for a, b in zip(got, expected)))
    assert worst <= tol, f"max probability difference {worst:.2e} > {tol:.1e}"


def test_rerun_after_deleting_a_shard_redoes_only_that_shard(resnet_job, folder, tmp_path,
                                                             capsys):
    output = tmp_path / "out"
    shutil.copytree(resnet_job, output)
    shards = sorted(output.glob("*.parquet"))
    victim = shards[len(shards) // 2]
    lost = {r["path"] for r in pq.read_table(victim).to_pylist()}
    victim.unlink()
    kept = {p: p.stat().st_mtime_ns for p in output.glob("*.parquet")}

    code, out, _ = run_batch(capsys, "resnet", "--input", folder, "--output", output,
                             "--weights", weights("resnet18"), "--device", "cpu",
                             "--shard-rows", "8")
    assert code == 0
    assert f"this run: {len(lost)} new, {50 - len(lost)} already there" in out
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # untouched
    new = [p for p in output.glob("*.parquet") if p not in kept]
    assert {r["path"] for p in new for r in pq.read_table(p).to_pylist()} == lost
    assert_complete(read_rows(output), images_of(folder))


def test_unreadable_shard_is_removed_and_its_images_redone(resnet_job, folder, tmp_path,
                                                           capsys):
    output = tmp_path / "out"
    shutil.copytree(resnet_job, output)
    victim = sorted(output.glob("*.parquet"))[0]
    lost = len(pq.read_table(victim))
    victim.write_bytes(victim.read_bytes()[:100])  # a run killed while writing it

    code, out, err = run_batch(capsys, "resnet", "--input", folder, "--output", output,
                               "--weights", weights("resnet18"), "--device", "cpu")
    assert code == 0 and f"removing unreadable shard {victim}" in err
    assert f"this run: {lost} new" in out and not victim.exists()
    assert_complete(read_rows(output), images_of(folder))


def test_killed_actor_loses_and_duplicates_nothing(ray_runtime, folder, tmp_path):
    from candle_nn_models.scripts.batch_models import JobOptions
    from candle_nn_models.scripts.batch_pipeline import InputSource, Predictor, Resources, run_job

    marker = tmp_path / "killed"

    class DiesOnce(Predictor):
        """Kills its own process in the middle of its second batch, once per job."""

        calls = 0

        def __call__(self, batch):
            DiesOnce.calls += 1
            if DiesOnce.calls == 2 and not marker.exists():
                marker.write_text(str(os.getpid()))
                os._exit(1)  # like an OOM kill: no exception, no cleanup
            return super().__call__(batch)

    images = images_of(folder)[:20]
    subset = tmp_path / "list.txt"
    subset.write_text("".join(f"{p}\n" for p in images))
    output = tmp_path / "out"
    output.mkdir()
    summary = run_job(InputSource.parse(str(subset)), output,
                      JobOptions("resnet", str(weights("resnet18"))),
                      Resources(device="cpu", actors=1, batch_size=4, shard_rows=4),
                      predictor_cls=DiesOnce)
    assert marker.exists(), "the fault was not injected"
    assert summary.rows == summary.new_rows == 20
    assert_complete(read_rows(output), images)


def test_list_and_parquet_inputs_with_relative_paths(ray_runtime, folder, tmp_path, capsys,
                                                     monkeypatch):
    import pyarrow as pa

    picked = good_images(folder)[:5] + [folder / "bad_empty.png"]
    monkeypatch.chdir(folder)
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(p.name for p in picked) + "\n\n")  # relative, a blank line
    table = tmp_path / "list.parquet"
    pq.write_table(pa.table({"path": [p.name for p in picked], "label": list(range(6))}), table)
    for source in (listing, table):
        output = tmp_path / f"out_{source.suffix[1:]}"
        code, out, _ = run_batch(capsys, "resnet", "--input", source, "--output", output,
                                 "--weights", weights("resnet18"), "--device", "cpu")
        assert code == 0 and "6 images in" in out and "1 error(s)" in out
        assert_complete(read_rows(output), picked)


@pytest.mark.parametrize("model, fixture, task", [("yolo_v8", "yolov8n", "detect"),
                                                  ("yolo_v8_pose", "yolov8n_pose", "pose")])
def test_yolo_rows_equal_the_plain_cli(ray_runtime, folder, tmp_path, capsys, model, fixture,
                                       task):
    import candle_nn_models.scripts.yolo_v8 as yolo_cli

    # batches of 2: the last one holds only corrupt images (no letterbox numbers at all)
    picked = good_images(folder)[:4] + [folder / "bad_garbage.jpg", folder / "bad_empty.png"]
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{p}\n" for p in picked))
    code, _, _ = run_batch(capsys, model, "--input", listing, "--output", tmp_path / "out",
                           "--weights", weights(fixture), "--device", "cpu", "--size", 320,
                           "--batch-size", 2, "--iou", 0.45)  # both the same, whatever the defaults
    assert code == 0
    rows = {r["path"]: r for r in read_rows(tmp_path / "out")}
    assert_complete(list(rows.values()), picked)

    argv = [a for p in picked[:-2] for a in ("--image", str(p))]
    assert yolo_cli.main([*argv, "--weights", str(weights(fixture)), "--device", "cpu",
                          "--size", "320", "--square", "--out", str(tmp_path / "cli"),
                          "--iou", "0.45", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)["images"]
    _, meta, _ = load_fixture(fixture)
    tol = meta["tolerance"]["pred"]["rtol_of_max_abs"]
    total = 0
    for image in cli:
        got, expected = rows[image["image"]]["detections"], image["detections"]
        assert len(got) == len(expected), image["image"]
        total += len(got)
        for g, e in zip(got, expected):  # the CLI rounds to 0.01 px and 1e-4
            assert g["class_id"] == e["class_id"] and g["class_name"] == e["class_name"]
            assert abs(g["score"] - e["score"]) <= 5e-5 + tol
            assert np.allclose(g["box_xyxy"], e["box_xyxy"], rtol=tol, atol=0.005 + tol * 640)
            if task == "pose":
                assert np.allclose(g["keypoints"], e["keypoints"], rtol=tol,
                                   atol=0.005 + tol * 640)
    assert total > 0


def test_sam_rows_equal_the_predictor(ray_runtime, folder, tmp_path, capsys):
    from pycocotools import mask as mask_utils

    from candle_nn_models.segment_anything import Sam, SamPredictor
    from candle_nn_models.scripts.common import load_rgb

    picked = [folder / "bike.jpg", folder / "bad_truncated.jpg"]
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{p}\n" for p in picked))
    code, _, _ = run_batch(capsys, "segment_anything", "--input", listing, "--output",
                           tmp_path / "out", "--weights", weights("mobile_sam"), "--device",
                           "cpu")
    assert code == 0
    rows = read_rows(tmp_path / "out")
    assert_complete(rows, picked)
    row = next(r for r in rows if r["error"] is None)

    predictor = SamPredictor(Sam.load(cn.VarBuilder.from_safetensors(
        weights("mobile_sam"), device="cpu")))
    predictor.set_image(load_rgb(picked[0]))
    assert row["point_xy"] == [400.0, 278.0]  # the centre of 800x556
    masks, ious, _ = predictor.predict(point_coords=np.array([row["point_xy"]]),
                                       point_labels=np.array([1]), multimask_output=True)
    _, meta, _ = load_fixture("mobile_sam")
    tol = meta["tolerance"]["iou_predictions"]["rtol_of_max_abs"]
    assert len(row["masks"]) == 3
    for got, mask, iou in zip(row["masks"], masks, ious):
        rle = {"size": got["size"], "counts": got["counts"].encode("ascii")}
        decoded = mask_utils.decode(rle).astype(bool)
        assert decoded.shape == (556, 800) and got["area"] == int(decoded.sum())
        assert (decoded != mask).mean() <= 1e-4  # a pixel may sit on the 0.0 threshold
        assert abs(got["iou"] - iou) <= tol * np.abs(ious).max()


def test_bad_inputs_one_error_line_and_no_output(ray_runtime, folder, tmp_path, capsys):
    output = tmp_path / "out"
    cases = [
        (["resnet", "--input", tmp_path / "nope", "--weights", weights("resnet18")],
         "no such folder, file or glob"),
        (["yolo_v8", "--input", folder, "--weights", weights("resnet18")], "YOLOv8"),
        (["resnet", "--input", folder, "--weights", weights("resnet18"), "--batch-size", "0"],
         "--batch-size must be at least 1"),
    ]
    for argv, fragment in cases:
        code, out, err = run_batch(capsys, *argv, "--output", output)
        assert code == 1, err
        error_line(err, fragment)
        assert not output.exists()


def test_rerun_with_other_options_is_refused(resnet_job, folder, capsys):
    code, _, err = run_batch(capsys, "resnet", "--input", folder, "--output", resnet_job,
                             "--weights", weights("resnet18"), "--top-k", 3)
    assert code == 1 and "holds results of another job (top_k: 5 there, 3 now)" in err


def test_missing_batch_extra_names_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    monkeypatch.setitem(sys.modules, "ray.data", None)
    code, out, err = run_batch(capsys, "resnet", "--input", tmp_path, "--output",
                               tmp_path / "out", "--weights", weights("resnet18"))
    assert code == 1 and out == ""
    assert err.strip() == ("error: candle-nn-batch needs Ray Data, which is not installed "
                           "(import of ray.data halted; None in sys.modules): "
                           "pip install 'candle-nn-mlx[batch]'")
    assert not (tmp_path / "out").exists()


def test_models_listed_by_the_cli_are_the_batch_models():
    from candle_nn_models.scripts.batch_models import BATCH_MODELS

    assert set(batch_cli.MODELS) == set(BATCH_MODELS)
