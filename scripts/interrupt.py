"""Ctrl-C (SIGINT) and SIGTERM end a CLI at once, with one line and no traceback.

Python runs signal handlers only between bytecodes of the main thread, so a Ctrl-C during a long
MLX forward (the SAM encoder: seconds) would wait for the forward to end, and one during start-up
prints a ``KeyboardInterrupt`` traceback. :func:`install` instead has the C-level handler write the
signal number to a socket (``signal.set_wakeup_fd``) that a small thread waits on; MLX releases the
GIL while it computes, so that thread runs right away: it removes the run's staged output files
(callbacks registered with :func:`on_interrupt`, then every staging file of
:mod:`candle_nn.atomic_write` not yet renamed), prints ``error: interrupted`` and exits with
128 + the signal number (130 for Ctrl-C). Standard library only: it is installed before anything
heavy is imported.

Where the platform has ``pthread_sigmask`` and ``sigwait`` (Linux, macOS) the two signals are
instead blocked in the main thread before any other thread exists, so every thread started later
(MLX's, CUDA's, the BLAS's) inherits the mask and none is ever interrupted mid-call, and the
watcher thread takes them synchronously with ``sigwait``. (Delivered asynchronously, a SIGINT
that landed during MLX's CUDA start-up on an H100 ended the process with exit status 4 and no
message.)
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from typing import Callable

_callbacks: list[Callable[[], None]] = []
_installed = False
_NAMES = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


def on_interrupt(callback: Callable[[], None]) -> None:
    """Call ``callback`` (from the watcher thread) before exiting on a signal."""
    _callbacks.append(callback)


def forget(callback: Callable[[], None]) -> None:
    """Undo :func:`on_interrupt` (no error when ``callback`` was not registered)."""
    try:
        _callbacks.remove(callback)
    except ValueError:
        pass


def install() -> None:
    """Make SIGINT/SIGTERM end the process promptly (main thread only; idempotent)."""
    global _installed
    if _installed:
        return
    if hasattr(signal, "pthread_sigmask") and hasattr(signal, "sigwait"):
        signals = set(_NAMES)
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        threading.Thread(target=_wait, args=(signals,), name="candle-nn-signals",
                         daemon=True).start()
        _installed = True
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    for signum in _NAMES:  # a Python-level handler is what makes the C handler write the fd
        signal.signal(signum, _ignore)
    threading.Thread(target=_watch, args=(reader, writer), name="candle-nn-signals",
                     daemon=True).start()
    _installed = True


def _ignore(signum, frame) -> None:  # the watcher thread does the work
    pass


def _wait(signals: set[int]) -> None:
    while True:
        _exit_on(signal.sigwait(signals))


def _watch(reader: socket.socket, writer: socket.socket) -> None:
    while True:
        for signum in reader.recv(64):
            _exit_on(signum)


def _exit_on(signum: int) -> None:
    """Remove the staged outputs, say why, and end the process: 128 + the signal number."""
    if signum not in _NAMES:
        return
    for callback in list(_callbacks):
        try:
            callback()
        except Exception:  # exiting anyway; never a traceback
            pass
    staging = sys.modules.get("candle_nn.atomic_write")  # not imported: nothing staged
    if staging is not None:
        try:
            staging.remove_live_staging()
        except Exception:
            pass
    os.write(2, f"error: {_NAMES[signum]}\n".encode())
    os._exit(128 + signum)
