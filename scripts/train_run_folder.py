"""A training command's run folder (``candle-resnet train``, ``candle-yolo-v8 train``): never
overwritten, one training at a time.

* A new run (no ``--resume``) refuses a folder that already holds any file of a run: its weights
  are never replaced, even once its checkpoint is gone.
* The process that writes the files holds ``OUT/train.lock`` (:mod:`folder_lock`) while it trains
  or resumes: a second training into the same folder is one error naming the first.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Sequence

from candle_nn import CandleNNError

from candle_nn_models.scripts.common import shown
from candle_nn_models.scripts.folder_lock import check_unheld, hold

__all__ = ["LOCK", "check_run_unheld", "hold_run", "refuse_existing_run"]

LOCK = "train.lock"


def refuse_existing_run(out: Path, files: Sequence[str]) -> None:
    """Raise when ``out`` holds any of the run's ``files`` (paths relative to ``out``)."""
    found = [name for name in files if (out / name).exists()]
    if found:
        raise CandleNNError(f"{shown(out)} already holds a run ({', '.join(found)}): pass "
                            "--resume to continue it, or another --out to start a new one")


@contextlib.contextmanager
def hold_run(out: Path, tool: str, writes: bool, new_run_files: Sequence[str] = ()
             ) -> Iterator[None]:
    """Hold ``out`` (created when absent) for this training, when this process ``writes`` the
    files (rank 0 under ``mlx.launch``); a new run's ``new_run_files`` are checked again under the
    lock (a run that started and finished since the first check)."""
    if not writes:
        yield
        return
    with hold(out, LOCK, tool, "--out", what="run"):
        refuse_existing_run(out, new_run_files)
        yield


def check_run_unheld(out: Path, tool: str) -> None:
    """Fail early, before the slow start-up, when another training holds ``out`` now."""
    if out.is_dir():
        check_unheld(out, LOCK, tool, "--out", what="run")
