"""``candle-nn-batch`` on a local Ray runtime (started once for the module, 2 CPUs): a folder of
~50 generated and fixture images with a few corrupt ones, through every model.

Checks: each image appears exactly once in the Parquet output, corrupt images become error rows,
a rerun after deleting (or truncating) a shard redoes that shard's images and nothing else, an
actor killed mid-batch loses and duplicates nothing, and the results equal the plain CLIs'
(``candle-resnet --json``, ``candle-yolo-v8 --square --json``) or ``SamPredictor``'s on the same
images, within the fixtures' tolerances. Also the message when the ``batch`` extra is missing.

The output folder (docs/batch.md): files the job did not write are refused and never changed,
resume is keyed on the weights' SHA-256 (not their path), a second job on one folder is refused
(the lock), each image is once across duplicate inputs, retried failures and reruns, the summary
counts what was written, Ray is quiet without ``--verbose``, files get the umask's mode, and
``--iou`` defaults to ultralytics' 0.7. A YOLO row's detections are the YOLO task API's
``Result.to_json()`` record for the image.
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
from candle_nn_models.scripts.common import environment_restored

import ray  # not importorskip: without Ray these tests fail
CORRUPT = ("bad_garbage.jpg", "bad_truncated.jpg", "bad_empty.png")


@pytest.fixture(scope="module")
def ray_runtime():
    """One local Ray runtime for the module (Ray's start-up is the costly part); the variables
    ray.init sets in os.environ (PYTHONBREAKPOINT, RAY_AUTH_MODE...) go with it."""
    with environment_restored():
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
    output.mkdir()
    (output / "README.txt").write_text("the user's own notes\n")  # never touched
    code = batch_cli.main(["resnet", "--input", str(folder), "--output", str(output),
                           "--weights", str(weights("resnet18")), "--device", "cpu",
                           "--batch-size", "8", "--shard-rows", "8"])
    assert code == 0
    return output


def test_every_image_once_and_error_rows_for_corrupt_ones(resnet_job, folder):
    rows = read_rows(resnet_job)
    assert len(rows) == 50
    assert (resnet_job / "README.txt").read_text() == "the user's own notes\n"
    assert sorted(p.name for p in resnet_job.iterdir() if p.suffix != ".parquet") == [
        "README.txt", "_candle_nn_batch.json"]  # no lock or temporary file left
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
    """... and retries the failed images: their new rows replace the old error rows."""
    output = tmp_path / "out"
    shutil.copytree(resnet_job, output)
    shards = sorted(output.glob("*.parquet"))
    victim = next(s for s in shards[len(shards) // 2:]
                  if all(r["error"] is None for r in pq.read_table(s).to_pylist()))
    lost = {r["path"] for r in pq.read_table(victim).to_pylist()}
    victim.unlink()
    failed = {str(folder / name) for name in CORRUPT}
    kept = {p: p.stat().st_mtime_ns for p in output.glob("*.parquet")
            if not failed & {r["path"] for r in pq.read_table(p).to_pylist()}}

    code, out, _ = run_batch(capsys, "resnet", "--input", folder, "--output", output,
                             "--weights", weights("resnet18"), "--device", "cpu",
                             "--shard-rows", "8")
    assert code == 0
    assert (f"this run: {len(lost) + 3} new (3 retried after an error), "
            f"{50 - len(lost) - 3} already there") in out
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # untouched
    new = [p for p in output.glob("*.parquet") if p.name not in {q.name for q in shards}]
    assert {r["path"] for p in new for r in pq.read_table(p).to_pylist()} == lost | failed
    assert_complete(read_rows(output), images_of(folder))


def test_unreadable_shard_is_removed_and_its_images_redone(resnet_job, folder, tmp_path,
                                                           capsys):
    output = tmp_path / "out"
    shutil.copytree(resnet_job, output)
    victim = next(s for s in sorted(output.glob("*.parquet"))
                  if all(r["error"] is None for r in pq.read_table(s).to_pylist()))
    lost = len(pq.read_table(victim))
    victim.write_bytes(victim.read_bytes()[:100])  # damaged after it was written

    code, out, err = run_batch(capsys, "resnet", "--input", folder, "--output", output,
                               "--weights", weights("resnet18"), "--device", "cpu")
    assert code == 0 and f"removing unreadable shard {victim}" in err
    assert f"this run: {lost + 3} new (3 retried after an error)" in out
    assert not victim.exists()
    assert_complete(read_rows(output), images_of(folder))


def test_killed_actor_loses_and_duplicates_nothing(ray_runtime, folder, tmp_path):
    from candle_nn_models.scripts.ray_models import JobOptions
    from candle_nn_models.scripts.ray_pipeline import InputSource, Predictor, Resources, run_job

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
    assert summary.rows == summary.written == 20
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
                           "--batch-size", 2, "--iou", 0.7)
    assert code == 0
    rows = {r["path"]: r for r in read_rows(tmp_path / "out")}
    assert_complete(list(rows.values()), picked)

    argv = [a for p in picked[:-2] for a in ("--image", str(p))]
    assert yolo_cli.main([*argv, "--weights", str(weights(fixture)), "--device", "cpu",
                          "--size", "320", "--square", "--iou", "0.7", "--out",
                          str(tmp_path / "cli"), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)["images"]
    _, meta, _ = load_fixture(fixture)
    tol = meta["tolerance"]["pred"]["rtol_of_max_abs"]
    total = 0
    for image in cli:
        got, expected = rows[image["image"]]["detections"], image["detections"]
        assert len(got) == len(expected), image["image"]
        total += len(got)
        unmatched = list(got)
        for e in expected:  # the CLI rounds to 0.01 px and 1e-4; near-equal scores may swap
            g = next((g for g in unmatched if g["class_id"] == e["class_id"]
                      and g["class_name"] == e["class_name"]
                      and abs(g["score"] - e["score"]) <= 5e-5 + tol
                      and np.allclose(g["box_xyxy"], e["box_xyxy"], rtol=tol,
                                      atol=0.005 + tol * 640)), None)
            assert g is not None, (image["image"], e)
            unmatched.remove(g)
            if task == "pose":
                assert np.allclose(g["keypoints"], e["keypoints"], rtol=tol,
                                   atol=0.005 + tol * 640)
    assert total > 0


@pytest.mark.parametrize("model, fixture", [("yolo_v8", "yolov8n"),
                                            ("yolo_v8_pose", "yolov8n_pose")])
def test_yolo_rows_are_the_api_records(folder, model, fixture):
    """A YOLO row is the image's ``Result.to_json()`` (the app's and ``candle-yolo-v8 --json``'s
    record) from ``yolo.load(...).predict(image, square=True)``: its size and its detections,
    exactly (as float32, the row's Arrow type). The job's own steps run here, in this process:
    a Ray actor sets its BLAS to its CPU count, which moves the last bits of a float (the Ray
    run is ``test_yolo_rows_equal_the_plain_cli``)."""
    import pyarrow as pa

    from candle_nn_models import yolo
    from candle_nn_models.scripts.ray_models import JobOptions, identify
    from candle_nn_models.scripts.ray_pipeline import decode_batch

    options, job = identify(JobOptions(model, str(weights(fixture)), size=320))
    api = yolo.load(weights(fixture), "cpu")
    total = 0
    for path in good_images(folder)[:3]:
        batch = decode_batch({"path": np.array([str(path)], dtype=object)}, job)
        (found,) = job.predict(batch["input"], {k: batch[k] for k in job.extras},
                               np.stack([batch["height"], batch["width"]], axis=1))
        row = {"path": str(path), "error": None, "width": int(batch["width"][0]),
               "height": int(batch["height"][0]), **found}
        (row,) = pa.Table.from_pylist([row], schema=job.schema()).to_pylist()
        (result,) = api.predict(path, imgsz=options.size, square=True)
        record = result.to_json()
        assert (row["height"], row["width"]) == (record["height"], record["width"])
        assert _as_float32(row["detections"]) == _as_float32(record["detections"]), path
        total += len(record["detections"])
    assert total > 0


def _as_float32(value):
    """``value`` with every float as float32 (a Parquet row's float32 columns read back)."""
    if isinstance(value, dict):
        return {k: _as_float32(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_float32(v) for v in value]
    return np.float32(value) if isinstance(value, float) else value


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


def test_a_job_where_every_image_failed_exits_1(ray_runtime, folder, tmp_path, capsys):
    """As the image CLIs (exit 0 when any image succeeded, 1 when none did): the summary on
    stdout, one error line, and the error rows kept for a rerun to retry."""
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{folder / name}\n" for name in CORRUPT))
    output = tmp_path / "out"
    code, out, err = run_batch(capsys, "resnet", "--input", listing, "--output", output,
                               "--weights", weights("resnet18"), "--device", "cpu")
    assert code == 1
    assert out.startswith(f"{output}: 3 images in ") and "3 error(s)" in out
    error_line(err, "no image could be processed", f"all 3 rows in {output} are errors")
    assert len(read_rows(output)) == 3


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
    from candle_nn_models.scripts.ray_models import BATCH_MODELS

    assert set(batch_cli.MODELS) == set(BATCH_MODELS)


# --- the output folder: only the job's own files, the right model's rows, each image once ---


def test_files_the_job_did_not_write_are_refused_and_left_alone(ray_runtime, folder, tmp_path,
                                                               capsys):
    """A user's own Parquet tables in --output (one readable, one not) are never removed or
    changed: the job refuses to start, naming them, and writes nothing."""
    import pyarrow as pa

    output = tmp_path / "out"
    output.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "label": ["a", "b"]}), output / "mine.parquet")
    (output / "half.parquet").write_bytes(b"PAR1 a table still being copied")
    (output / "notes.txt").write_text("notes\n")
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in output.iterdir()}

    code, out, err = run_batch(capsys, "resnet", "--input", folder / "bike.jpg", "--output",
                               output, "--weights", weights("resnet18"), "--device", "cpu")
    assert code == 1 and out == "", err
    error_line(err, str(output), "did not write", "half.parquet", "mine.parquet",
               "pass another --output")
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in output.iterdir()} == before


def test_resume_is_keyed_on_the_weights_digest_not_the_path(ray_runtime, folder, tmp_path,
                                                             capsys):
    """Replacing the weights file at the same path is another job: refused, never mixed."""
    import hashlib

    from safetensors.numpy import load_file, save_file

    images = good_images(folder)[:2]
    listing = tmp_path / "list.txt"
    listing.write_text(f"{images[0]}\n")
    path = tmp_path / "resnet.safetensors"
    shutil.copy(weights("resnet18"), path)
    output = tmp_path / "out"
    argv = ["resnet", "--input", listing, "--output", output, "--weights", path, "--device",
            "cpu"]
    code, out, err = run_batch(capsys, *argv)
    assert code == 0 and "1 images in 1 shard(s)" in out, err
    digest = hashlib.sha256(path.read_bytes()).hexdigest()

    tensors = load_file(weights("resnet18"))
    tensors["fc.bias"] = tensors["fc.bias"] + 1.0  # another model, same file name
    save_file(tensors, path)
    listing.write_text("".join(f"{p}\n" for p in images))
    shards = {p: p.read_bytes() for p in output.glob("*.parquet")}
    code, out, err = run_batch(capsys, *argv)
    assert code == 1 and out == ""
    error_line(err, "holds results of another job (weights: SHA-256", f"from {path}",
               "pass a new --output")
    assert {p: p.read_bytes() for p in output.glob("*.parquet")} == shards
    assert len(read_rows(output)) == 1
    manifest = json.loads((output / "_candle_nn_batch.json").read_text())
    assert manifest["job"]["weights_sha256"] == digest
    assert manifest["job"]["variant"] == "resnet18"

    # an actor that finds another file at the path than the job started with (replaced while
    # the job runs) stops the job with one error, and nothing is written
    from candle_nn_models.scripts.ray_models import JobOptions
    from candle_nn_models.scripts.ray_pipeline import InputSource, Resources, run_job

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with pytest.raises(cn.CandleNNError, match=f"^{path} is not the weights this job started "
                       f"with .*expected {digest[:12]}"):
        run_job(InputSource.parse(str(listing)), fresh,
                JobOptions("resnet", str(path), variant="resnet18", weights_sha256=digest),
                Resources(device="cpu", actors=1, batch_size=4, shard_rows=4))
    assert list(fresh.iterdir()) == []


def test_each_image_exactly_once_across_duplicates_failures_and_reruns(
        ray_runtime, folder, tmp_path, capsys, monkeypatch):
    """One image named three ways is one row; an image missing on the first run is an error
    row, retried and replaced when it comes back; a rerun with nothing to do writes nothing
    and says so."""
    monkeypatch.chdir(folder)
    (tmp_path / "link.jpg").symlink_to(folder / "bike.jpg")
    late = tmp_path / "late.png"
    other = good_images(folder)[1]
    listing = tmp_path / "list.txt"
    listing.write_text(f"{folder / 'bike.jpg'}\n./bike.jpg\n{tmp_path / 'link.jpg'}\n{late}\n"
                       f"{other}\n")
    output = tmp_path / "out"
    argv = ["resnet", "--input", listing, "--output", output, "--weights",
            weights("resnet18"), "--device", "cpu"]

    code, out, _ = run_batch(capsys, *argv)
    assert code == 0
    assert out.strip() == (f"{output}: 3 images in 1 shard(s), 1 error(s); this run: 3 new, 0 "
                           "already there, 2 duplicate input path(s) ignored")
    rows = {r["path"]: r for r in read_rows(output)}
    assert sorted(rows) == sorted([str(folder / "bike.jpg"), str(late), str(other)])
    assert rows[str(late)]["error"] is not None

    shutil.copy(other, late)  # the missing image comes back
    code, out, _ = run_batch(capsys, *argv)
    assert code == 0 and "1 error(s)" not in out
    assert "this run: 1 new (1 retried after an error), 2 already there" in out
    rows = read_rows(output)
    assert len(rows) == 3 and all(r["error"] is None for r in rows)
    assert next(r for r in rows if r["path"] == str(late))["top_k"] == \
        next(r for r in rows if r["path"] == str(other))["top_k"]

    files = {p: p.stat().st_mtime_ns for p in output.iterdir()}
    code, out, _ = run_batch(capsys, *argv)
    assert code == 0 and "this run: 0 new, 3 already there" in out
    assert {p: p.stat().st_mtime_ns for p in output.iterdir()} == files  # nothing written


def test_a_second_job_on_the_same_output_is_refused(ray_runtime, folder, tmp_path, capsys):
    """While a job runs, another job on its --output gets one error naming the lock; the first
    one finishes with each image once."""
    import threading
    import time

    from candle_nn_models.scripts.ray_models import JobOptions
    from candle_nn_models.scripts.ray_pipeline import InputSource, Predictor, Resources, run_job

    go = tmp_path / "go"

    class Waits(Predictor):
        """Holds its first batch until ``go`` exists (at most 60 s)."""

        def __call__(self, batch):
            deadline = time.monotonic() + 60
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            return super().__call__(batch)

    images = good_images(folder)[:3]
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{p}\n" for p in images))
    output = tmp_path / "out"
    output.mkdir()
    result = {}
    first = threading.Thread(target=lambda: result.update(summary=run_job(
        InputSource.parse(str(listing)), output, JobOptions("resnet", str(weights("resnet18"))),
        Resources(device="cpu", actors=1, batch_size=4, shard_rows=4), predictor_cls=Waits)))
    first.start()
    try:
        deadline = time.monotonic() + 60
        while not (output / "_candle_nn_batch.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        code, out, err = run_batch(capsys, "resnet", "--input", listing, "--output", output,
                                   "--weights", weights("resnet18"), "--device", "cpu")
    finally:
        go.write_text("")
        first.join()
    assert code == 1 and out == "", err
    error_line(err, f"another candle-nn-batch job is writing to {output}",
               f"lock {output / '_candle_nn_batch.lock'} held by candle-nn-batch job: pid "
               f"{os.getpid()}")
    assert result["summary"].written == result["summary"].rows == 3
    assert_complete(read_rows(output), images)
    assert not (output / "_candle_nn_batch.lock").exists()


def test_quiet_by_default_and_files_with_the_users_mode(folder, tmp_path):
    """A fresh process, as a user runs it: stdout is the summary line, stderr is empty (no Ray
    INFO/WARNING/``E …`` lines); every file written has the mode the umask gives (027: 0640)."""
    import subprocess

    listing = tmp_path / "list.txt"
    listing.write_text(f"{folder / 'bike.jpg'}\n{folder / 'bad_empty.png'}\n")
    output = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    proc = subprocess.run(
        [sys.executable, "-m", "candle_nn_models.scripts.batch", "resnet", "--input", listing,
         "--output", output, "--weights", weights("resnet18"), "--device", "cpu"],
        capture_output=True, text=True, env=env, timeout=300,
        preexec_fn=lambda: os.umask(0o027))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"{output}: 2 images in 1 shard(s), 1 error(s); this run: 2 new, 0 "
                           "already there\n")
    assert proc.stderr == ""
    files = list(output.iterdir())
    assert len(files) == 2  # the manifest and one shard
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {
        p.name: "0o640" for p in files}


def test_called_as_a_function_it_leaves_the_callers_environment(folder, tmp_path):
    """``batch.main`` starts and stops its own Ray; what ``ray.init`` sets in ``os.environ``
    (``PYTHONBREAKPOINT`` pointing at Ray's debugger, ``RAY_AUTH_MODE``) must not outlive it in
    the caller's process. A fresh process: this module's Ray runtime must not be running."""
    import subprocess

    listing = tmp_path / "list.txt"
    listing.write_text(f"{folder / 'bike.jpg'}\n")
    code = ("import json, os, sys; import ray; before = dict(os.environ); "
            "from candle_nn_models.scripts.batch import main; code = main(sys.argv[1:]); "
            "after = dict(os.environ); print(json.dumps([code, {k: [before.get(k), after.get(k)] "
            "for k in set(before) | set(after) if before.get(k) != after.get(k)}]))")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RAY_") and k != "PYTHONBREAKPOINT"}
    proc = subprocess.run(
        [sys.executable, "-c", code, "resnet", "--input", str(listing), "--output",
         str(tmp_path / "out"), "--weights", str(weights("resnet18")), "--device", "cpu",
         "--actors", "1"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    code, changed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert code == 0 and changed == {}, changed


def test_verbose_shows_rays_own_lines(monkeypatch):
    import logging

    import ray

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    assert batch_cli.start_ray(None, 2, 0, verbose=True)
    assert calls[-1]["logging_level"] == logging.INFO and calls[-1]["log_to_driver"]
    assert batch_cli.start_ray(None, 2, 0)
    assert calls[-1]["logging_level"] == logging.ERROR and not calls[-1]["log_to_driver"]


def test_iou_default_is_ultralytics(capsys):
    from candle_nn_models.scripts.ray_models import JobOptions

    parser = batch_cli.build_parser()
    assert parser.parse_args(["yolo_v8", "--input", "x", "--output", "y"]).iou == 0.7
    assert JobOptions("yolo_v8", None).iou == 0.7
    parser.print_help()
    assert "default 0.7, as ultralytics" in " ".join(capsys.readouterr().out.split())


def test_manifest_and_lock_files_that_are_not_the_jobs(tmp_path):
    """A folder from an older version (no weights digest), and a user's own files under the
    names the job uses, are refused and left as they were."""
    from candle_nn_models.scripts.ray_output import LOCK, MANIFEST, Manifest, claim

    old = tmp_path / "old"
    old.mkdir()
    (old / MANIFEST).write_text(json.dumps({"model": "resnet", "weights": "/w", "top_k": 5}))
    with pytest.raises(cn.CandleNNError, match="older candle-nn-batch.*pass a new --output"):
        Manifest.read(old)

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / MANIFEST).write_text('{"my": "settings"}\n')
    (mine / LOCK).write_text("my notes\n")
    with pytest.raises(cn.CandleNNError, match="is not a candle-nn-batch manifest"):
        Manifest.read(mine)
    with pytest.raises(cn.CandleNNError, match="is not a candle-nn-batch lock file"):
        with claim(mine):
            pass
    assert (mine / MANIFEST).read_text() == '{"my": "settings"}\n'
    assert (mine / LOCK).read_text() == "my notes\n"

    with claim(tmp_path):  # a claim of the job's own leaves nothing behind
        assert (tmp_path / LOCK).read_text().startswith("candle-nn-batch job: pid ")
    assert not (tmp_path / LOCK).exists()
