"""One process at a time in an output folder: a lock file under ``flock``, held for a job's or a
training run's length (``candle-nn-batch``'s output, ``candle-resnet train``'s and
``candle-yolo-v8 train``'s run folders).

The lock file holds one line naming its holder (``<tool> <what>: pid N on HOST since TIME``),
which a refused process shows. The kernel releases a ``flock`` when its process dies, so a killed
run never leaves a stale claim: the next one takes the file over.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from candle_nn import CandleNNError
from candle_nn.atomic_write import remove_quietly

__all__ = ["FolderLockedError", "check_unheld", "hold"]

_HOLDER_BYTES = 300


class FolderLockedError(CandleNNError):
    """Another process holds the folder."""


def _locked(folder: Path, path: Path, holder: bytes, tool: str, what: str,
            option: str) -> FolderLockedError:
    who = holder.decode("utf-8", "replace").strip() or "another process"
    return FolderLockedError(f"another {tool} {what} is writing to {folder} (lock {path} held "
                             f"by {who}): wait for it to finish, or pass another {option}")


@contextlib.contextmanager
def hold(folder: Path, lock_name: str, tool: str, option: str,
         what: str = "job") -> Iterator[None]:
    """Hold ``folder`` (created when absent) through ``folder/lock_name``: a second process gets
    a :class:`FolderLockedError` naming the lock and its holder, and a folder that cannot be
    created or written a :class:`CandleNNError` naming ``option``. The lock file is removed on
    the way out (still under the lock: a waiting process sees the file change)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CandleNNError(f"cannot create the folder {folder}: {exc.strerror or exc}; pass "
                            f"another {option}") from None
    path = folder / lock_name
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise CandleNNError(f"cannot create the lock file {path}: {exc.strerror or exc}; "
                                f"pass another {option}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, _HOLDER_BYTES)
            os.close(fd)
            raise _locked(folder, path, holder, tool, what, option) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:  # the holder removed it as we opened it: take the new one
            same = False
        if same:
            break
        os.close(fd)
    owned = False
    try:
        text = os.read(fd, _HOLDER_BYTES)
        if text and not text.startswith(tool.encode()):
            raise CandleNNError(f"{path} is not a {tool} lock file: move it out of {folder}, or "
                                f"pass another {option}")
        owned = True
        os.ftruncate(fd, 0)
        os.pwrite(fd, (f"{tool} {what}: pid {os.getpid()} on {socket.gethostname()} since "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}\n").encode(), 0)
        yield
    finally:
        if owned:
            remove_quietly(path)
        os.close(fd)


def check_unheld(folder: Path, lock_name: str, tool: str, option: str,
                 what: str = "job") -> None:
    """Raise :class:`FolderLockedError` when another process holds ``folder`` now (a quick
    check before slow work; :func:`hold` is the claim). Changes nothing."""
    path = folder / lock_name
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _locked(folder, path, os.read(fd, _HOLDER_BYTES), tool, what, option) from None
    finally:
        os.close(fd)
