"""The output folder of a ``candle-nn-batch`` job: which files are the job's, one job at a time,
and exactly one row per image.

    OUT/_candle_nn_batch.json   the manifest: what produced the rows (model, variant, the weights'
                                SHA-256, the options that change a row) and the runs so far
    OUT/_candle_nn_batch.lock   there while a job runs; its ``flock`` refuses a second job
    OUT/candle-nn-batch-<run>-<task>-<part>.parquet
                                the shards, each written whole (a temporary file renamed into
                                place), tagged with the job's digest and their run in the Parquet
                                key-value metadata

A file is the job's when its name is a shard name of a run that the manifest lists (or the
temporary file of one): only such files are ever rewritten or removed. Any other Parquet file in
the folder is refused (a Parquet reader of the folder would take it for part of the output);
every other file is left alone. When a path has several rows (an image that failed and was
retried, a run killed between writing and tidying up), the successful row wins, then the newest
run's; the others are dropped from their shards.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq
from ray.data.block import BlockAccessor
from ray.data.datasource import Datasink

from candle_nn import CandleNNError
from candle_nn.atomic_write import atomic_write, remove_quietly

from candle_nn_models.scripts.folder_lock import check_unheld, hold

MANIFEST = "_candle_nn_batch.json"  # "_" prefix: Parquet readers skip it (and the lock)
LOCK = "_candle_nn_batch.lock"
TOOL = "candle-nn-batch"  # the lock's holder line: "candle-nn-batch job: pid ..."
FORMAT = "candle-nn-batch/2"
METADATA_KEY = b"candle_nn_batch"
_RUN = r"\d{8}T\d{6}Z-[0-9a-f]{8}"
SHARD_RE = re.compile(rf"candle-nn-batch-(?P<run>{_RUN})-\d{{6}}-\d{{3,}}\.parquet")
# atomic_write's temporary files: ".<stem>-XXXXXXXX<suffix>" (tempfile's 8 random characters)
SHARD_TEMP_RE = re.compile(rf"\.candle-nn-batch-(?P<run>{_RUN})-\d{{6}}-\d{{3,}}-\w{{8}}\.parquet")
MANIFEST_TEMP_RE = re.compile(r"\._candle_nn_batch-\w{8}\.json")


def new_run_id() -> str:
    """``YYYYMMDDTHHMMSSZ-xxxxxxxx``: sorts by start time, unique."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + os.urandom(4).hex()


def shard_name(run: str, task: int, part: int) -> str:
    return f"candle-nn-batch-{run}-{task:06d}-{part:03d}.parquet"


def job_digest(job: dict[str, Any]) -> str:
    """A short digest of the job's identity, stored in every shard."""
    return hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:16]


def claim(output: Path) -> "contextlib.AbstractContextManager[None]":
    """Hold ``output`` for one job: ``OUT/_candle_nn_batch.lock`` (:func:`folder_lock.hold`); a
    second job gets a FolderLockedError naming the lock and its holder."""
    return hold(output, LOCK, TOOL, "--output")


@dataclass
class Manifest:
    """``OUT/_candle_nn_batch.json``: the job's identity and its runs, oldest first."""

    job: dict[str, Any]
    weights: str  # where the driver read the weights on the first run (for people)
    runs: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, output: Path) -> "Manifest | None":
        path = output / MANIFEST
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise CandleNNError(f"{path} is not a readable candle-nn-batch manifest ({exc}): "
                                "pass another --output") from None
        if isinstance(data, dict) and data.get("format") == FORMAT:
            return cls(data["job"], data["weights"], data["runs"])
        if isinstance(data, dict) and {"model", "weights"} <= set(data):
            raise CandleNNError(
                f"{output} was written by an older candle-nn-batch, which did not record a digest "
                "of its weights: its rows cannot be checked against these weights; pass a new "
                "--output")
        raise CandleNNError(f"{path} is not a candle-nn-batch manifest: move it out of {output}, "
                            "or pass another --output")

    def check(self, output: Path, job: dict[str, Any], weights: str) -> None:
        """CandleNNError unless ``job`` is the job whose rows ``output`` holds."""
        diff = []
        for key in dict.fromkeys([*self.job, *job]):
            have, want = self.job.get(key), job.get(key)
            if have == want:
                continue
            if key == "weights_sha256":
                diff.append(f"weights: SHA-256 {str(have)[:12]}… there (read from {self.weights}), "
                            f"{str(want)[:12]}… now (from {weights})")
            else:
                diff.append(f"{key}: {have!r} there, {want!r} now")
        if diff:
            raise CandleNNError(f"{output} holds results of another job ({'; '.join(diff)}): "
                                "rerun with the same weights and options to resume, or pass a "
                                "new --output")

    def write(self, output: Path) -> None:
        data = {"format": FORMAT, "job": self.job, "weights": self.weights, "runs": self.runs}
        with atomic_write(output / MANIFEST) as tmp:
            tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class Row:
    """Where one path's row is."""

    shard: str
    index: int
    ok: bool
    run: int  # the run's position in the manifest

    def rank(self) -> tuple[bool, int, str]:
        return (self.ok, self.run, self.shard)  # a success beats an error, then the newest run


@dataclass
class OutputState:
    """The job's rows in the output folder: the one row of each path, and rows it supersedes."""

    winners: dict[str, Row] = field(default_factory=dict)
    losers: dict[str, list[int]] = field(default_factory=dict)  # shard -> row indices
    shards: set[str] = field(default_factory=set)

    def add(self, path: str, row: Row) -> None:
        best = self.winners.get(path)
        if best is not None and best.rank() > row.rank():
            self.losers.setdefault(row.shard, []).append(row.index)
            return
        if best is not None:
            self.losers.setdefault(best.shard, []).append(best.index)
        self.winners[path] = row

    def done(self) -> frozenset[str]:
        """Paths whose row is a success (an error row is retried)."""
        return frozenset(p for p, r in self.winners.items() if r.ok)


def classify(output: Path, manifest: Manifest | None
             ) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """The folder's entries that matter: the job's shards ``(name, run)``, temporary files left
    by a killed run of the job, and Parquet files that are not the job's. Changes nothing."""
    runs = {r["id"] for r in manifest.runs} if manifest else set()
    shards, stale, foreign = [], [], []
    for entry in sorted(os.scandir(output), key=lambda e: e.name):
        name = entry.name
        shard = SHARD_RE.fullmatch(name)
        temp = SHARD_TEMP_RE.fullmatch(name)
        if shard and shard["run"] in runs and entry.is_file(follow_symlinks=False):
            shards.append((name, shard["run"]))
        elif ((temp and temp["run"] in runs) or (manifest and MANIFEST_TEMP_RE.fullmatch(name))) \
                and entry.is_file(follow_symlinks=False):
            stale.append(name)
        elif name.lower().endswith(".parquet"):
            foreign.append(name)
    if foreign:
        listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3
                                           else "")
        raise CandleNNError(
            f"{output} holds Parquet files that this candle-nn-batch job did not write ({listed}): "
            "it never changes or removes them, and a reader of the folder would take them for "
            "part of the output; move them elsewhere, or pass another --output")
    return shards, stale, foreign


def preflight(output: Path, job: dict[str, Any], weights: str) -> None:
    """Before Ray starts (a quick failure): the checks a job makes once it holds ``output`` —
    no other job holds it, its rows are this job's, no Parquet file of someone else's.
    Changes nothing."""
    if not output.is_dir():
        return
    check_unheld(output, LOCK, TOOL, "--output")
    manifest = Manifest.read(output)
    if manifest is not None:
        manifest.check(output, job, weights)
    classify(output, manifest)


def scan(output: Path, manifest: Manifest | None, schema: pa.Schema) -> OutputState:
    """Read the job's shards in ``output`` (CandleNNError for a Parquet file that is not the
    job's). A shard of the job's that cannot be read is removed (its images are redone), and
    temporary files left by a killed run of the job are removed (the caller holds the lock)."""
    runs = {r["id"]: i for i, r in enumerate(manifest.runs)} if manifest else {}
    digest = job_digest(manifest.job) if manifest else None
    shards, stale, _ = classify(output, manifest)
    for name in stale:
        remove_quietly(output / name)
    state = OutputState()
    for name, run in shards:
        read_shard(output / name, runs[run], run, digest, schema, state)
    return state


def read_shard(path: Path, run_index: int, run: str, digest: str | None, schema: pa.Schema,
               state: OutputState) -> None:
    try:
        parquet = pq.ParquetFile(path)
        tag_bytes = (parquet.schema_arrow.metadata or {}).get(METADATA_KEY, b"{}")
        table = parquet.read(columns=["path", "error"])
    except (pa.ArrowException, OSError) as exc:
        print(f"warning: removing unreadable shard {path} ({exc}); its images are redone",
              file=sys.stderr)
        path.unlink()
        return
    try:
        tag = json.loads(tag_bytes)
    except ValueError:
        tag = {}
    if not isinstance(tag, dict) or tag.get("job") != digest or tag.get("run") != run:
        raise CandleNNError(f"{path} has a shard's name but was not written by this job (its "
                            "metadata differ): move it out of the folder, or pass another --output")
    names = parquet.schema_arrow.names
    if names != schema.names:
        raise CandleNNError(f"{path} has columns {names}, not those of this job "
                            f"({schema.names}): pass a new --output folder")
    state.shards.add(path.name)
    errors = table.column("error").to_pylist()
    for i, p in enumerate(table.column("path").to_pylist()):
        state.add(p, Row(path.name, i, errors[i] is None, run_index))


def drop_superseded(output: Path, state: OutputState) -> None:
    """Rewrite (whole, renamed into place) each shard holding rows another row supersedes;
    remove a shard left empty."""
    for name, indices in sorted(state.losers.items()):
        path = output / name
        table, drop = pq.read_table(path), set(indices)
        keep = pa.array([i not in drop for i in range(table.num_rows)])
        kept = table.filter(keep)
        if kept.num_rows == 0:
            path.unlink()
            state.shards.discard(name)
        else:
            with atomic_write(path) as tmp:
                pq.write_table(kept, tmp)
    state.losers.clear()


class ShardSink(Datasink):
    """Ray Data sink: each write task writes its rows as shards of at most ``shard_rows`` rows,
    each whole or not at all (a temporary file beside it, renamed), with the mode a new file of
    the user's gets, named after the run and tagged with the job's digest. A retried task
    rewrites the same names."""

    def __init__(self, output: Path, run: str, digest: str, schema: pa.Schema,
                 shard_rows: int) -> None:
        self.output, self.run, self.digest = str(output), run, digest
        self.schema, self.shard_rows = schema, shard_rows
        self.written: list[tuple[str, int]] = []

    @property
    def min_rows_per_write(self) -> int:
        return self.shard_rows

    def get_name(self) -> str:
        return "Shards"

    def write(self, blocks: Iterable[Any], ctx: Any) -> list[tuple[str, int]]:
        tables = [BlockAccessor.for_block(b).to_arrow() for b in blocks]
        tables = [t.select(self.schema.names).cast(self.schema) for t in tables if t.num_rows]
        if not tables:
            return []
        tag = json.dumps({"job": self.digest, "run": self.run})
        table = pa.concat_tables(tables).replace_schema_metadata({METADATA_KEY: tag})
        written = []
        for part, start in enumerate(range(0, table.num_rows, self.shard_rows)):
            name = shard_name(self.run, ctx.task_idx, part)
            chunk = table.slice(start, self.shard_rows)
            with atomic_write(Path(self.output) / name) as tmp:
                pq.write_table(chunk, tmp)
            written.append((name, chunk.num_rows))
        return written

    def on_write_complete(self, write_result: Any) -> None:
        self.written = [w for task in write_result.write_returns for w in (task or [])]
