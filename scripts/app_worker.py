"""``candle-nn-app``'s model worker: one thread runs every model call, in arrival order.

Requests arrive on many HTTP threads; the models (and MLX's stream state) live on this one thread,
so visitors are queued instead of competing for the cores and memory, and a full queue answers
"busy" at once instead of piling up work without end. A job whose caller has gone (a closed page)
is dropped while it waits, and a long job that asks :meth:`ModelWorker.stop_requested` between
its steps ("segment everything") stops at the next one, so the next visitor does not wait for
work nobody will see.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from typing import Callable, TypeVar

from candle_nn import CandleNNError

T = TypeVar("T")


class BusyError(CandleNNError):
    """The worker's queue is full: the request was not taken."""


class Abandoned(CandleNNError):
    """The caller went away before its job's answer: the job was dropped or told to stop."""


class ModelWorker:
    """Runs callables on a single thread, at most ``max_queue`` waiting or running at a time."""

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="candle-nn-app-model")
        self._lock = threading.Lock()
        self._pending = 0
        self._stop = threading.local()  # on the worker thread: the running job's stop event

    def run(self, fn: Callable[..., T], *args, abandoned: Callable[[], bool] | None = None,
            poll_s: float = 0.25, **kwargs) -> T:
        """``fn(*args, **kwargs)`` on the worker thread, after the jobs queued before it; its
        result or its exception. BusyError when ``max_queue`` jobs are already waiting.

        ``abandoned``: asked every ``poll_s`` seconds while the job waits or runs; once true, a
        job still queued never runs, a running one is told to stop (:meth:`stop_requested`),
        and :class:`Abandoned` is raised here at once. A job counts against ``max_queue`` until
        it has really ended."""
        with self._lock:
            if self._pending >= self.max_queue:
                raise BusyError(f"the server is busy ({self._pending} requests queued): try "
                                "again in a moment")
            self._pending += 1
        stop = threading.Event()
        try:
            future = self._pool.submit(self._call, stop, fn, args, kwargs)
        except BaseException:
            self._done()
            raise
        if abandoned is None:
            return future.result()
        while True:
            try:
                return future.result(timeout=poll_s)
            except FutureTimeout:
                if abandoned():
                    stop.set()
                    if future.cancel():  # it never started: _call will not count it off
                        self._done()
                    raise Abandoned("the client went away; its job was dropped") from None

    def stop_requested(self) -> bool:
        """On the worker thread, inside a job: whether its caller has gone (the job should stop
        at its next step, e.g. by raising :class:`Abandoned`)."""
        stop = getattr(self._stop, "event", None)
        return stop is not None and stop.is_set()

    def _call(self, stop: threading.Event, fn: Callable[..., T], args, kwargs) -> T:
        self._stop.event = stop
        try:
            return fn(*args, **kwargs)
        finally:
            self._stop.event = None
            self._done()  # before the caller gets the answer: it then sees the queue without it

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1

    @property
    def pending(self) -> int:
        """Jobs waiting or running now."""
        with self._lock:
            return self._pending

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
