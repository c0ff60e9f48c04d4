"""Files written whole or not at all: a hidden staging file beside the destination, renamed onto
it (``os.replace``, atomic within one file system) only once it is complete.

:func:`atomic_write` does it for one file; :func:`temp_beside` makes the staging file for writers
that rename later themselves (a run's outputs committed together, a video and its JSON lines).
Errors are ``OSError`` as raised; callers turn them into their own one-line message.

Staging files are named ``.candle-nn-staging-<host>-<pid>-<random><suffix>`` whatever the
destination's name, so the name always fits the file system's limit (NAME_MAX) and a file left by
a killed process is recognisable: :func:`remove_stale_staging` removes those whose process (on
this host) is gone, and nothing else. A process ended by a signal (the CLIs exit from a watcher
thread, with no unwinding) first removes its own with :func:`remove_live_staging`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import socket
import stat
from pathlib import Path
from typing import Iterator

STAGING_PREFIX = ".candle-nn-staging-"
_MAX_SUFFIX = 16  # bytes of the destination's suffix kept (writers pick the format from it)
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_live: set[Path] = set()  # this process's staging files, until renamed or removed
_STAGING = re.compile(re.escape(STAGING_PREFIX) + r"([0-9a-f]{8})-([0-9]+)-[0-9a-z]{8}(\.[^/]*)?$")


def staging_name(suffix: str = "") -> str:
    """A fresh staging file name for this process (short: fits NAME_MAX for any ``suffix``)."""
    if len(os.fsencode(suffix)) > _MAX_SUFFIX or not suffix.startswith("."):
        suffix = ""
    return f"{STAGING_PREFIX}{_HOST}-{os.getpid()}-{secrets.token_hex(4)}{suffix}"


def is_staging(name: str) -> bool:
    """Whether a file name is one of :func:`staging_name`'s (any process, any host)."""
    return _STAGING.match(name) is not None


def temp_beside(path: "str | os.PathLike", suffix: str | None = None) -> Path:
    """A new empty staging file in ``path``'s folder (so the final rename stays on one file
    system), created with mode ``0o666`` so that the umask gives it the permissions a plain
    ``open(path, "w")`` would (not mkstemp's 0600). ``suffix`` defaults to ``path``'s own: writers
    that pick the format from the name (Pillow, PyAV, MLX) see the right one."""
    path = Path(path)
    suffix = path.suffix if suffix is None else suffix
    while True:
        tmp = path.parent / staging_name(suffix)
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        if len(_live) >= 256:  # writers that rename the file themselves never say so: forget
            _live.difference_update([p for p in list(_live) if not p.exists()])  # the renamed
        _live.add(tmp)
        return tmp


def remove_quietly(path: "str | os.PathLike") -> None:
    """Remove a temporary file if it is still there."""
    with contextlib.suppress(OSError):
        os.remove(path)
    _live.discard(Path(path))


def remove_live_staging() -> list[Path]:
    """Remove the staging files this process made and has not yet renamed or removed: for a
    process about to end without unwinding (``os._exit`` on Ctrl-C). Safe from any thread.
    Returns what was removed."""
    removed = []
    for path in list(_live):
        with contextlib.suppress(OSError):
            os.remove(path)
            removed.append(path)
        _live.discard(path)
    return removed


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by someone else
        return False
    return False


def remove_stale_staging(folder: "str | os.PathLike", recursive: bool = False) -> list[Path]:
    """Remove the staging files in ``folder`` (and, with ``recursive``, its subfolders; symlinks
    are not followed) left by processes of this host that no longer run (a SIGKILL, a power
    cut). Only regular files named by :func:`staging_name` are touched. Returns what was
    removed; unreadable folders are passed over."""
    removed: list[Path] = []
    for root, dirs, files in os.walk(folder):
        for name in files:
            match = _STAGING.match(name)
            if not match or match.group(1) != _HOST or not _process_gone(int(match.group(2))):
                continue
            path = Path(root) / name
            with contextlib.suppress(OSError):
                if os.path.isfile(path) and not os.path.islink(path):
                    os.remove(path)
                    removed.append(path)
        if not recursive:
            break
    return removed


@contextlib.contextmanager
def atomic_write(path: "str | os.PathLike", suffix: str | None = None) -> Iterator[Path]:
    """``with atomic_write(path) as tmp:`` write the whole file to ``tmp``; when the block ends
    normally ``tmp`` replaces ``path``, otherwise (an exception, Ctrl-C) it is removed and
    ``path`` is left as it was. Stale staging files of killed processes in the same folder are
    removed first. See :func:`temp_beside` for ``suffix``; the file gets its permissions even
    when the writer replaced ``tmp`` by a file of its own (safetensors' ``save_file``: 0600)."""
    remove_stale_staging(Path(path).parent)
    tmp = temp_beside(path, suffix)
    try:
        mode = stat.S_IMODE(os.stat(tmp).st_mode)
        yield tmp
        if stat.S_IMODE(os.stat(tmp).st_mode) != mode:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
        _live.discard(tmp)
    except BaseException:
        remove_quietly(tmp)
        raise
