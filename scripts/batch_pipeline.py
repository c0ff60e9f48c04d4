"""The Ray Data pipeline behind ``candle-nn-batch``.

    image paths (lazy: from_items / read_text / read_parquet)
      -> decode + preprocess      Ray tasks, ``batch_size`` paths each; a bad image -> error row
      -> predict                  a fixed pool of stateful actors (``map_batches`` with a class),
                                  weights loaded once per actor, one GPU each on a GPU job
      -> write_parquet            shards of about ``shard_rows`` rows in the output folder

Resuming: the paths already in the output folder's shards are skipped by the decode tasks, so a
rerun does only what is missing. A shard that cannot be read (a run killed while writing it) is
removed and its images are redone. Fault tolerance is Ray Data's own, left at its defaults (Ray
2.60 deprecates passing these through ``map_batches``): a dead actor is restarted
(``max_restarts=-1``) and its in-flight batches are resubmitted (``max_task_retries=-1``); a
decode or write task whose worker dies is retried (``max_retries=-1``). Ray discards a failed
task's output, so every input lands in exactly one row. Exceptions raised by the model itself are
not retried: they fail the job (Ray Data's ``retried_map_errors=False``).
"""

from __future__ import annotations

import glob
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from candle_nn import CandleNNError, Device, ImageError
from candle_nn.atomic_write import atomic_write
from candle_nn_models.scripts.batch_models import BatchModel, JobOptions, batch_model
from candle_nn_models.scripts.common import load_rgb, shown
from candle_nn_models.scripts.inputs import IMAGE_SUFFIXES, expand_image_args

MANIFEST = "_candle_nn_batch.json"  # "_" prefix: Parquet readers skip it
DECODE_CPUS = 0.5


@dataclass(frozen=True)
class InputSource:
    """Where the image paths come from: ``kind`` is ``paths`` (a folder, a glob or one image,
    listed here), ``list`` (a text file, one path a line) or ``parquet`` (its ``path`` column).
    Relative paths in a list or Parquet file are relative to ``cwd``, the folder the command
    ran in."""

    kind: str
    spec: str
    paths: tuple[str, ...] = ()
    cwd: str = field(default_factory=os.getcwd)

    @classmethod
    def parse(cls, spec: str) -> "InputSource":
        """Check ``--input`` and classify it (ImageError when there is nothing to read)."""
        path = Path(spec)
        if path.is_file() and path.suffix.lower() == ".txt":
            return cls("list", str(path.resolve()))
        if path.is_file() and path.suffix.lower() == ".parquet":
            try:
                names = pq.read_schema(path).names
            except (pa.ArrowException, OSError) as exc:
                raise ImageError(f"{path} is not a readable Parquet file ({exc})") from None
            if "path" not in names:
                raise ImageError(f"{path} has no 'path' column: --input PARQUET needs one string "
                                 "column named 'path' with the image paths")
            return cls("parquet", str(path.resolve()))
        if path.is_dir() or path.is_file():
            items = expand_image_args([spec])
            found = [item.path for item in items if not item.error]
            if not found:
                raise ImageError(f"{shown(items[0].path)}: {items[0].error}")
        elif glob.has_magic(spec):
            found = sorted(Path(p) for p in glob.iglob(spec, recursive=True)
                           if Path(p).is_file() and Path(p).suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise ImageError(f"no image files match {spec!r}")
        else:
            raise ImageError(f"--input {spec}: no such folder, file or glob match (give a "
                             "folder, a glob, a .txt list of paths or a .parquet file)")
        return cls("paths", spec, tuple(str(p.resolve()) for p in found))

    def dataset(self, block_rows: int) -> "ray.data.Dataset":
        """A lazy dataset with one string column ``path``."""
        if self.kind == "paths":
            blocks = max(1, -(-len(self.paths) // block_rows))
            return ray.data.from_items([{"path": p} for p in self.paths],
                                       override_num_blocks=blocks)
        if self.kind == "list":
            return ray.data.read_text(self.spec).rename_columns({"text": "path"})
        return ray.data.read_parquet(self.spec, columns=["path"])


@dataclass(frozen=True)
class Resources:
    """How the job uses the Ray cluster."""

    device: str          # "cpu" or "gpu": each GPU actor takes one whole GPU
    actors: int
    batch_size: int      # images per model call (and per decode task)
    shard_rows: int      # rows per Parquet shard (a hint to Ray)


@dataclass
class JobSummary:
    """What the output folder holds after a run."""

    rows: int
    errors: int
    new_rows: int
    skipped: int
    shards: int


def decode_batch(batch: dict[str, np.ndarray], model: BatchModel, done: frozenset[str],
                 cwd: str) -> dict[str, np.ndarray]:
    """Ray task: drop paths already in the output, read and preprocess the rest.

    Returns columns ``path``, ``width``, ``height``, ``error`` ("" when fine: an all-null column
    would not survive Ray's Arrow round trip as strings), ``input``
    ``(N, *model.input_shape)`` (zeros for a failed image) and the model's ``extras`` columns
    (0 for a failed image: every block has the same columns).
    """
    paths = [os.path.normpath(os.path.join(cwd, str(p).strip())) for p in batch["path"]]
    paths = [p for p in paths if p not in done and p != cwd]  # p == cwd: a blank list line
    inputs = np.zeros((len(paths), *model.input_shape), dtype=model.input_dtype)
    sizes = np.zeros((len(paths), 2), dtype=np.int32)
    errors = [""] * len(paths)
    per_image: list[dict[str, Any]] = []
    for i, path in enumerate(paths):
        try:
            rgb = load_rgb(path)
            inputs[i], extra = model.preprocess(rgb)
            sizes[i] = rgb.shape[:2]
        except Exception as exc:  # any bad image becomes an error row
            errors[i] = (str(exc) if isinstance(exc, CandleNNError) else f"{path}: {exc!r}") or "?"
            extra = {}
        per_image.append(extra)
    return {"path": np.array(paths, dtype=object), "height": sizes[:, 0], "width": sizes[:, 1],
            "error": np.array(errors, dtype=object), "input": inputs,
            **{k: np.array([e.get(k, 0) for e in per_image], dtype=np.float64)
               for k in model.extras}}


class Predictor:
    """Ray actor: loads the model once, then turns decoded batches into output rows.

    Ray Data calls the actor from worker threads, while MLX streams belong to the thread that
    made them: the model is loaded and run on one thread of the actor's own.
    """

    def __init__(self, options: JobOptions, device: str) -> None:
        from candle_nn import blas

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
        blas.set_num_threads(max(1, int(cpus)))
        self.model = batch_model(options)
        self.schema = self.model.schema()
        self._mlx = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlx")
        # a GPU actor sees only its own GPU, as gpu:0
        self._mlx.submit(self.model.load, Device.parse(device)).result()

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        ok = np.array([not e for e in batch["error"]], dtype=bool)
        n = len(ok)
        results = iter(self._mlx.submit(
            self.model.predict, batch["input"][ok],
            {k: batch[k][ok] for k in self.model.extras},
            np.stack([batch["height"], batch["width"]], axis=1)[ok]).result() if ok.any() else [])
        rows = []
        for i in range(n):
            row = {"path": str(batch["path"][i]), "error": str(batch["error"][i]) or None,
                   "width": int(batch["width"][i]) if ok[i] else None,
                   "height": int(batch["height"][i]) if ok[i] else None}
            rows.append({**row, **next(results)} if ok[i] else row)
        return pa.Table.from_pylist(rows, schema=self.schema)


def scan_output(output: Path, schema: pa.Schema) -> frozenset[str]:
    """The paths already in ``output``'s shards. Unreadable shards are removed (their images are
    redone); a shard of another schema is a CandleNNError."""
    done: set[str] = set()
    for shard in sorted(output.glob("*.parquet")):
        try:
            names = pq.read_schema(shard).names
            paths = pq.read_table(shard, columns=["path"]).column("path").to_pylist()
        except (pa.ArrowException, OSError) as exc:
            print(f"warning: removing unreadable shard {shard} ({exc}); its images are redone",
                  file=sys.stderr)
            shard.unlink()
            continue
        if names != schema.names:
            raise CandleNNError(f"{shard} has columns {names}, not those of this job "
                                f"({schema.names}): pass a new --output folder")
        done.update(paths)
    return frozenset(done)


def check_manifest(output: Path, options: JobOptions) -> None:
    """Write the job's options beside the shards, or check a rerun uses the same ones."""
    path, want = output / MANIFEST, asdict(options)
    if path.exists():
        have = json.loads(path.read_text())
        diff = [f"{k}: {have.get(k)!r} there, {v!r} now" for k, v in want.items()
                if have.get(k) != v]
        if diff:
            raise CandleNNError(f"{output} holds results of another job ({'; '.join(diff)}): "
                                "rerun with the same options to resume, or pass a new --output")
        return
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(want, indent=2) + "\n")


def summarize(output: Path, before: frozenset[str]) -> JobSummary:
    shards = sorted(output.glob("*.parquet"))
    rows = errors = 0
    for shard in shards:
        column = pq.read_table(shard, columns=["error"]).column("error")
        rows += len(column)
        errors += len(column) - column.null_count
    return JobSummary(rows=rows, errors=errors, new_rows=rows - len(before), skipped=len(before),
                      shards=len(shards))


def run_job(source: InputSource, output: Path, options: JobOptions, resources: Resources,
            predictor_cls: type = Predictor) -> JobSummary:
    """Run (or resume) a job on the Ray runtime this process is connected to."""
    model = batch_model(options)
    check_manifest(output, options)
    done = scan_output(output, model.schema())
    if source.kind == "paths" and done.issuperset(source.paths):
        return summarize(output, done)  # nothing left: no actors to start
    decoded = source.dataset(resources.batch_size).map_batches(
        partial(decode_batch, model=model, done=done, cwd=source.cwd),
        batch_size=resources.batch_size, batch_format="numpy",
        # Half a CPU: two decode tasks share a core (they wait on file reads); and a resource
        # shape unlike the CPU actors' keeps Ray from fusing decoding into them, so decoding
        # overlaps inference instead of taking turns with it.
        num_cpus=DECODE_CPUS)
    gpu = resources.device == "gpu"
    predicted = decoded.map_batches(
        predictor_cls, fn_constructor_args=(options, resources.device),
        batch_size=resources.batch_size, batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=resources.actors),
        num_gpus=1 if gpu else 0, num_cpus=1)  # a CPU actor's BLAS runs on its one core
    predicted.write_parquet(str(output), min_rows_per_file=resources.shard_rows,
                            max_rows_per_file=resources.shard_rows)
    return summarize(output, done)
