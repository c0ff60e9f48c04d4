"""Files written whole or not at all: a hidden temporary file beside the destination, renamed
onto it (``os.replace``, atomic within one file system) only once it is complete.

:func:`atomic_write` does it for one file; :func:`temp_beside` makes the temporary file for writers
that rename later themselves (a run's outputs committed together, a video and its JSON lines).
Errors are ``OSError`` as raised; callers turn them into their own one-line message.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def temp_beside(path: "str | os.PathLike", suffix: str | None = None) -> Path:
    """A new empty file ``.<stem>-XXXXXXXX<suffix>`` in ``path``'s folder (so the final rename
    stays on one file system), with the permissions a plain ``open(path, "w")`` would give
    (``0o666 & ~umask``, not mkstemp's 0600). ``suffix`` defaults to ``path``'s own: writers that
    pick the format from the name (Pillow, PyAV, MLX) see the right one."""
    path = Path(path)
    suffix = path.suffix if suffix is None else suffix
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_umask())
    except OSError:
        remove_quietly(tmp)
        raise
    return Path(tmp)


def remove_quietly(path: "str | os.PathLike") -> None:
    """Remove a temporary file if it is still there."""
    with contextlib.suppress(OSError):
        os.remove(path)


@contextlib.contextmanager
def atomic_write(path: "str | os.PathLike", suffix: str | None = None) -> Iterator[Path]:
    """``with atomic_write(path) as tmp:`` write the whole file to ``tmp``; when the block ends
    normally ``tmp`` replaces ``path``, otherwise (an exception, Ctrl-C) it is removed and
    ``path`` is left as it was. See :func:`temp_beside` for ``suffix``."""
    tmp = temp_beside(path, suffix)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise
