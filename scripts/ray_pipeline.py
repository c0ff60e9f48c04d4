"""The Ray Data pipeline behind ``candle-nn-batch``.

    image paths (read on the driver: resolved, duplicates and finished images dropped)
      -> decode + preprocess      Ray tasks, ``batch_size`` paths each; a bad image -> error row
      -> predict                  a fixed pool of stateful actors (``map_batches`` with a class),
                                  weights loaded once per actor, one GPU each on a GPU job
      -> write                    shards of about ``shard_rows`` rows in the output folder
                                  (:class:`~candle_nn_models.scripts.ray_output.ShardSink`)

Exactly once: the job holds the output folder (a lock), reads which images already have a row
(``ray_output``: only the job's own shards, checked against the weights' digest and options),
and runs the rest; an image whose row is an error is retried, and its new row supersedes the
old one. Fault tolerance is Ray Data's own, left at its defaults (Ray 2.60 deprecates passing
these through ``map_batches``): a dead actor is restarted (``max_restarts=-1``) and its in-flight
batches are resubmitted (``max_task_retries=-1``); a decode or write task whose worker dies is
retried (``max_retries=-1``), rewriting the same shard names. Exceptions raised by the model
itself are not retried: they fail the job (Ray Data's ``retried_map_errors=False``).
"""

from __future__ import annotations

import glob
import logging
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from candle_nn import CandleNNError, Device, ImageError
from candle_nn_models.scripts.ray_models import (BatchModel, JobOptions, batch_model, identify,
                                                 with_size)
from candle_nn_models.scripts.ray_output import (MANIFEST, Manifest, OutputState, ShardSink,
                                                   claim, drop_superseded, job_digest,
                                                   new_run_id, scan)
from candle_nn_models.scripts.common import load_rgb, shown
from candle_nn_models.scripts.input_paths import IMAGE_SUFFIXES, expand_image_args

DECODE_CPUS = 0.5
CANDLE_ERROR_LINE = re.compile(r"^candle_nn\.errors\.\w+: (.+)$", re.M)


@dataclass(frozen=True)
class InputSource:
    """The images of ``--input``, each once: absolute paths with symbolic links resolved, in
    input order; ``duplicates`` counts the entries that named an image already listed."""

    spec: str
    paths: tuple[str, ...]
    duplicates: int = 0

    @classmethod
    def parse(cls, spec: str) -> "InputSource":
        """Read ``--input``: a folder, a glob, an image, a text file (one path a line) or a
        Parquet file (its ``path`` column). Relative paths in a list are relative to the current
        folder. ImageError when there is nothing to read."""
        path = Path(spec)
        if path.is_file() and path.suffix.lower() in (".txt", ".parquet"):
            entries = list(read_list(path))
            if not entries:
                raise ImageError(f"{path} lists no image paths")
        elif path.is_dir() or path.is_file():
            items = expand_image_args([spec])
            entries = [str(item.path) for item in items if not item.error]
            if not entries:
                raise ImageError(f"{shown(items[0].path)}: {items[0].error}")
        elif glob.has_magic(spec):
            entries = sorted(p for p in glob.iglob(spec, recursive=True)
                             if Path(p).is_file() and Path(p).suffix.lower() in IMAGE_SUFFIXES)
            if not entries:
                raise ImageError(f"no image files match {spec!r}")
        else:
            raise ImageError(f"--input {spec}: no such folder, file or glob match (give a "
                             "folder, a glob, a .txt list of paths or a .parquet file)")
        paths = tuple(dict.fromkeys(os.path.realpath(e) for e in entries))
        return cls(spec, paths, len(entries) - len(paths))


def read_list(path: Path) -> Iterator[str]:
    """The non-blank entries of a text list (one path a line) or of a Parquet file's ``path``
    column."""
    if path.suffix.lower() == ".txt":
        try:
            with open(path, "rb") as f:
                for line in f:
                    if name := os.fsdecode(line.strip()):
                        yield name
        except OSError as exc:
            raise ImageError(f"cannot read {path}: {exc.strerror or exc}") from None
        return
    try:
        parquet = pq.ParquetFile(path)
        column = parquet.schema_arrow.field("path") if "path" in parquet.schema_arrow.names \
            else None
        if column is None:
            raise ImageError(f"{path} has no 'path' column: --input PARQUET needs one string "
                             "column named 'path' with the image paths")
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise ImageError(f"{path}: its 'path' column holds {column.type}, not strings")
        for batch in parquet.iter_batches(columns=["path"]):
            for name in batch.column(0).to_pylist():
                if name and name.strip():
                    yield name.strip()
    except (pa.ArrowException, OSError) as exc:
        raise ImageError(f"{path} is not a readable Parquet file ({exc})") from None


@dataclass(frozen=True)
class Resources:
    """How the job uses the Ray cluster."""

    device: str          # "cpu" or "gpu": each GPU actor takes one whole GPU
    actors: int
    batch_size: int      # images per model call (and per decode task)
    shard_rows: int      # rows per Parquet shard (a hint to Ray)


@dataclass
class JobSummary:
    """What the output folder holds after a run, and what the run did."""

    rows: int        # images in the output (one row each)
    errors: int      # of them, error rows
    shards: int
    written: int     # rows this run wrote
    retried: int     # of them, images whose row was an error before
    skipped: int     # inputs that already had a successful row
    duplicates: int  # input entries that named an image already listed

    def line(self, output: "str | os.PathLike") -> str:
        retried = f" ({self.retried} retried after an error)" if self.retried else ""
        dups = (f", {self.duplicates} duplicate input path(s) ignored" if self.duplicates
                else "")
        return (f"{output}: {self.rows} images in {self.shards} shard(s), {self.errors} "
                f"error(s); this run: {self.written} new{retried}, {self.skipped} already "
                f"there{dups}")


def decode_batch(batch: dict[str, np.ndarray], model: BatchModel) -> dict[str, np.ndarray]:
    """Ray task: read and preprocess a batch of absolute paths.

    Returns columns ``path``, ``width``, ``height``, ``error`` ("" when fine: an all-null column
    would not survive Ray's Arrow round trip as strings), ``input``
    ``(N, *model.input_shape)`` (zeros for a failed image) and the model's ``extras`` columns
    (0 for a failed image: every block has the same columns).
    """
    paths = [str(p) for p in batch["path"]]
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


def quiet_ray_data(verbose: bool) -> None:
    """Ray Data's own console lines (INFO/WARNING: plans, logged progress) only with
    ``verbose``; its log file in the Ray session folder keeps them. Without ``verbose`` a
    progress bar shows on an interactive terminal only."""
    from ray.data import DataContext

    for handler in logging.getLogger("ray.data").handlers:
        if handler.get_name() == "console":
            handler.setLevel(logging.INFO if verbose else logging.ERROR)
    if not verbose:
        DataContext.get_current().enable_progress_bars = sys.stdout.isatty()


def run_job(source: InputSource, output: Path, options: JobOptions, resources: Resources,
            predictor_cls: type = Predictor, verbose: bool = False) -> JobSummary:
    """Run (or resume) a job on the Ray runtime this process is connected to, holding
    ``output`` for the job's length (FolderLockedError when another job holds it)."""
    quiet_ray_data(verbose)
    if options.weights_sha256 is None:
        options = identify(options)[0]
    options = with_size(options)
    model = batch_model(options)
    job, schema = model.identity(), model.schema()
    with claim(output):
        manifest = Manifest.read(output)
        new_manifest = manifest is None
        if manifest is not None:
            manifest.check(output, job, options.weights_label)
        state = scan(output, manifest, schema)
        done = state.done()
        failed = {p for p, row in state.winners.items() if not row.ok}
        pending = [p for p in source.paths if p not in done]
        skipped = len(source.paths) - len(pending)
        if not pending:
            drop_superseded(output, state)
            return summarize(state, None, skipped, 0, source.duplicates)
        run = new_run_id()
        if manifest is None:
            manifest = Manifest(job, options.weights_label)
        manifest.runs.append({"id": run, "weights": options.weights, "pid": os.getpid()})
        manifest.write(output)  # before any shard: a shard's run is always listed
        try:
            write(pending, output, options, resources, predictor_cls,
                  ShardSink(output, run, job_digest(job), schema, resources.shard_rows))
        except BaseException as exc:
            if new_manifest and not any(output.glob("candle-nn-batch-*.parquet")):
                (output / MANIFEST).unlink(missing_ok=True)  # nothing written
            if isinstance(exc, Exception):
                raise ours_from_ray(exc) from None
            raise
        state = scan(output, manifest, schema)
        drop_superseded(output, state)
        return summarize(state, len(manifest.runs) - 1, skipped,
                         sum(1 for p in pending if p in failed), source.duplicates)


def ours_from_ray(exc: Exception) -> Exception:
    """A CandleNNError raised in an actor or task (a weights file replaced during the job)
    reaches the driver as Ray's error with the remote traceback in its text: the one line of
    ours, or ``exc`` as it is."""
    found = CANDLE_ERROR_LINE.findall(str(exc)) if not isinstance(exc, CandleNNError) else []
    return CandleNNError(found[-1]) if found else exc


def write(paths: list[str], output: Path, options: JobOptions, resources: Resources,
          predictor_cls: type, sink: ShardSink) -> None:
    """Decode, predict and write ``paths`` through Ray Data."""
    model = batch_model(options)
    blocks = max(1, -(-len(paths) // resources.batch_size))
    decoded = ray.data.from_items([{"path": p} for p in paths], override_num_blocks=blocks
                                  ).map_batches(
        partial(decode_batch, model=model),
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
    predicted.write_datasink(sink)


def summarize(state: OutputState, run: int | None, skipped: int, retried: int,
              duplicates: int) -> JobSummary:
    rows = state.winners.values()
    return JobSummary(rows=len(rows), errors=sum(1 for r in rows if not r.ok),
                      shards=len(state.shards),
                      written=sum(1 for r in rows if r.run == run) if run is not None else 0,
                      retried=retried if run is not None else 0, skipped=skipped,
                      duplicates=duplicates)
