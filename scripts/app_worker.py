"""``candle-nn-app``'s model worker: one thread runs every model call, in arrival order.

Requests arrive on many HTTP threads; the models (and MLX's stream state) live on this one thread,
so visitors are queued instead of competing for the cores and memory, and a full queue answers
"busy" at once instead of piling up work without end.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from candle_nn import CandleNNError

T = TypeVar("T")


class BusyError(CandleNNError):
    """The worker's queue is full: the request was not taken."""


class ModelWorker:
    """Runs callables on a single thread, at most ``max_queue`` waiting or running at a time."""

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="candle-nn-app-model")
        self._lock = threading.Lock()
        self._pending = 0

    def run(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """``fn(*args, **kwargs)`` on the worker thread, after the jobs queued before it; its
        result or its exception. BusyError when ``max_queue`` jobs are already waiting."""
        with self._lock:
            if self._pending >= self.max_queue:
                raise BusyError(f"the server is busy ({self._pending} requests queued): try "
                                "again in a moment")
            self._pending += 1
        try:
            return self._pool.submit(fn, *args, **kwargs).result()
        finally:
            with self._lock:
                self._pending -= 1

    @property
    def pending(self) -> int:
        """Jobs waiting or running now."""
        with self._lock:
            return self._pending

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
