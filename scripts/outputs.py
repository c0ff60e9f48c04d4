"""A run's output folder: a fresh one per run, names that cannot collide, files written whole.

The layout follows ultralytics' ``runs/detect/predict``, ``predict2``, …: ``--out DIR`` names the
run folder. When ``DIR`` does not exist, or is an empty folder, the run writes there; otherwise it
writes to ``DIR2``, ``DIR3``, … (the first that is free), unless ``--exist-ok``. Every file of one
input image is named from one *stem* claimed for it (:meth:`OutputFolder.claim_stem`): the image's
own stem, ``<stem>-2``, ``<stem>-3``, … when another input of the run already has it (``x.jpg`` and
``x.png``), cut to fit the file system's name limit.

Each file is written in full to a staging file beside its destination
(:mod:`candle_nn.atomic_write`) and renamed into place by :meth:`OutputFolder.commit` (after each
image, or at the end of a ``--strict`` run). A failed image drops just its own files
(:meth:`OutputFolder.rollback`); a fatal error, Ctrl-C or SIGTERM removes every staged file
(:meth:`OutputFolder.abort`); staging files of a killed run are removed by the next run.

Every run folder holds ``.candle-nn-outputs.json``, the list of the files the project wrote there
(with their size and modification time) and the image each came from. With ``--exist-ok`` a file
is replaced only when that list says the project wrote it (and it is unchanged since), and an
image's files from the previous run that this run did not write again (fewer masks) are removed;
a file the project did not write is never overwritten or deleted: that image fails with a clear
error. The input listing (:mod:`candle_nn_models.scripts.input_paths`) skips the listed files, so an
output folder inside an input folder is never read back as input.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

from candle_nn import CandleNNError
from candle_nn.atomic_write import (atomic_write, remove_quietly, remove_stale_staging,
                                    temp_beside)
from candle_nn_models.scripts import interrupt
from candle_nn_models.scripts.common import ImageInputError, shown
from candle_nn_models.scripts.run_manifest import MANIFEST, read_manifest

STEM_BYTES = 200  # a stem's longest (UTF-8 bytes): leaves room for "_everything.png" in NAME_MAX
_PIL_FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".webp": "WEBP"}


def fit_name(name: str, limit: int = STEM_BYTES) -> str:
    """``name`` cut to at most ``limit`` bytes in the file system's encoding."""
    while len(os.fsencode(name)) > limit:
        name = name[:-1]
    return name


def _numbered(path: Path, n: int) -> Path:
    return path.with_name(f"{path.name}{n}")


def _free(path: Path) -> bool:
    """Nothing there, or an empty folder (a folder made ahead, or left by a killed run)."""
    if not path.exists() and not path.is_symlink():
        return True
    try:
        return path.is_dir() and not path.is_symlink() and not any(path.iterdir())
    except OSError:
        return False


class OutputFolder:
    """The run folder of one run (see the module docstring), chosen, checked and (when new)
    made when this object is; a run that writes nothing removes the folders it made."""

    def __init__(self, path: "str | os.PathLike", exist_ok: bool = False) -> None:
        self.requested = Path(path)
        self.exist_ok = exist_ok
        self._made: list[Path] = []  # folders this run made (removed at the end if empty)
        self._clean_stale()
        self.path = self.requested
        self._check()
        self._existed = True  # unless _choose makes it
        self.path = self._choose()
        self._manifest = read_manifest(self.path) if exist_ok else {}
        self._staged: list[tuple[Path, Path, str]] = []  # (staging file, destination, image)
        self._stems: set[str] = set()
        self._taken: set[Path] = set()  # every destination of this run, staged or committed
        self._committed: set[Path] = set()  # written by this run (never removed as stale)
        self._lock = threading.Lock()  # an interrupt waits for a commit in progress
        interrupt.on_interrupt(self.abort)

    # -- choosing the folder -----------------------------------------------------------------

    def _clean_stale(self) -> None:
        """Staging files of killed runs in this run folder and its numbered siblings."""
        req = self.requested
        parent = req.parent
        if not req.name or req.name in (".", ".."):
            remove_stale_staging(req, recursive=False)
            return
        pattern = re.compile(re.escape(req.name) + r"[0-9]*$")
        try:
            siblings = [parent / n for n in os.listdir(parent) if pattern.match(n)]
        except OSError:
            return
        for folder in siblings:
            if folder.is_dir() and not folder.is_symlink():
                remove_stale_staging(folder, recursive=True)

    def _choose(self) -> Path:
        req = self.requested
        if req.exists() and not req.is_dir():
            raise CandleNNError(f"--out {shown(req)} is a file, not a folder; pass a folder "
                                "with --out DIR")
        if self.exist_ok or self._claim(req):
            return req
        if not req.name or req.name in (".", ".."):
            raise CandleNNError(f"output folder {shown(req)} is not empty; pass --exist-ok to "
                                "write into it, or name a new folder with --out DIR")
        n = 2
        while not self._claim(_numbered(req, n)):
            n += 1
        return _numbered(req, n)

    def _claim(self, folder: Path) -> bool:
        """Take ``folder`` for this run if it is free: made now (so that a run started at the
        same moment takes the next one), or an empty folder already there."""
        if not _free(folder):
            return False
        if folder.is_dir():
            return True
        try:
            self._mkdirs(folder.parent)
            folder.mkdir()
        except FileExistsError:
            return False
        except OSError as exc:
            raise CandleNNError(f"cannot create output folder {shown(folder)}: "
                                f"{exc.strerror or exc}") from exc
        self._existed = False
        return True

    def _check(self) -> None:
        probe = self.path
        while not probe.exists():
            if probe.is_symlink() or probe.parent == probe:
                break
            probe = probe.parent
        if not probe.is_dir():
            raise CandleNNError(f"cannot create output folder {shown(self.path)}: {shown(probe)} "
                                "is not a folder; pass another --out DIR")
        if not os.access(probe, os.W_OK | os.X_OK):
            where = "" if probe == self.path else f" (folder {shown(probe)} is not writable)"
            raise CandleNNError(f"output folder {shown(self.path)} is not writable{where}; "
                                "pass another --out DIR")

    def create(self) -> Path:
        """Make the folder now (for writers that stage their own files); returns its path."""
        try:
            self._mkdirs(self.path)
        except OSError as exc:
            raise CandleNNError(f"cannot create output folder {shown(self.path)}: "
                                f"{exc.strerror or exc}") from exc
        return self.path

    def _mkdirs(self, folder: Path) -> None:
        missing = folder
        while not missing.is_dir() and missing != missing.parent:
            self._made.append(missing)
            missing = missing.parent
        folder.mkdir(parents=True, exist_ok=True)

    # -- names ---------------------------------------------------------------------------------

    def claim_stem(self, image: "str | os.PathLike") -> str:
        """The stem every output file of ``image`` is named from, unique in this run (compared
        without case: some file systems ignore it) and short enough for any output name."""
        stem = fit_name(Path(image).stem or "image")
        candidate, n = stem, 2
        while candidate.casefold() in self._stems:
            tail = f"-{n}"
            candidate, n = fit_name(stem, STEM_BYTES - len(tail)) + tail, n + 1
        self._stems.add(candidate.casefold())
        return candidate

    def next_free(self, folder: str, stem: str, suffix: str) -> str:
        """``<folder>/<stem><suffix>``, else ``<stem>2<suffix>``, ``<stem>3<suffix>``, … the
        first name no file of this run has (and no file the project did not write), as
        ultralytics numbers crops."""
        n = 1
        while True:
            name = f"{folder}/{stem}{n if n > 1 else ''}{suffix}"
            dest = self.path / name
            if dest not in self._taken and (not (dest.exists() or dest.is_symlink())
                                            or self._ours(dest)):
                return name
            n += 1

    # -- staging -------------------------------------------------------------------------------

    def save_image(self, image, name: str, source: "str | os.PathLike | None" = None) -> Path:
        """Stage a PIL ``image`` as ``<run folder>/<name>`` (format from the suffix: JPEG quality
        95, PNG, BMP, WebP; anything else PNG) for the input image ``source``. Returns the final
        path."""
        fmt = _PIL_FORMATS.get(Path(name).suffix.lower(), "PNG")
        options = {"quality": 95} if fmt == "JPEG" else {}
        return self._stage(name, source, lambda fh: image.save(fh, format=fmt, **options))

    def save_text(self, text: str, name: str, source: "str | os.PathLike | None" = None) -> Path:
        """Stage ``text`` (UTF-8) as ``<run folder>/<name>``. Returns the final path."""
        return self._stage(name, source, lambda fh: fh.write(text.encode("utf-8")))

    def _stage(self, name: str, source, write) -> Path:
        dest = self.path / name
        if dest in self._taken:
            raise CandleNNError(f"internal error: {shown(dest)} written twice in one run")
        self.check_replaceable(dest, source)
        try:
            self._mkdirs(dest.parent)
            tmp = temp_beside(dest)
        except OSError as exc:
            raise CandleNNError(f"cannot write {shown(dest)}: {exc.strerror or exc}") from exc
        with self._lock:
            self._staged.append((tmp, dest, "" if source is None else shown(source)))
            self._taken.add(dest)
        try:
            with open(tmp, "wb") as fh:
                write(fh)
        except OSError as exc:
            raise CandleNNError(f"cannot write {shown(dest)}: {exc.strerror or exc}") from exc
        return dest

    def _ours(self, dest: Path) -> bool:
        """``dest`` is a file the project wrote (listed, and unchanged since)."""
        entry = self._manifest.get(dest.relative_to(self.path).as_posix())
        try:
            info = os.lstat(dest)
        except OSError:
            return False
        return bool(entry) and entry.get("size") == info.st_size \
            and entry.get("mtime_ns") == info.st_mtime_ns

    def check_replaceable(self, dest: Path, source: "str | os.PathLike | None" = None) -> None:
        """Refuse to write ``dest`` over a file the project did not write: an ImageInputError
        for input ``source`` (that image fails), else a CandleNNError."""
        if (dest.exists() or dest.is_symlink()) and not self._ours(dest):
            reason = (f"{shown(dest)} already exists and was not written by this program: it is "
                      "left alone; pass another --out DIR (or move that file)")
            if source is None:
                raise CandleNNError(reason)
            raise ImageInputError(source, reason)

    def mark(self) -> int:
        """A point to :meth:`rollback` to (the number of files staged so far)."""
        return len(self._staged)

    def rollback(self, mark: int) -> None:
        """Drop the files staged since ``mark``."""
        with self._lock:
            for tmp, dest, _ in self._staged[mark:]:
                remove_quietly(tmp)
                self._taken.discard(dest)
            del self._staged[mark:]

    def commit(self) -> list[Path]:
        """Rename every staged file into place and record it in the run folder's file list; with
        ``--exist-ok``, remove the earlier files of the same images not written again. Returns
        the destinations."""
        with self._lock:
            if not self._staged:
                return []
            done: list[Path] = []
            images = {image for _, _, image in self._staged if image}
            try:
                for tmp, dest, image in self._staged:
                    self.check_replaceable(dest)
                    os.replace(tmp, dest)
                    done.append(dest)
                    info = os.stat(dest)
                    self._manifest[dest.relative_to(self.path).as_posix()] = {
                        "image": image, "size": info.st_size, "mtime_ns": info.st_mtime_ns}
                self._committed.update(done)
                self._remove_replaced(images)
                self._write_manifest()
            except OSError as exc:
                raise CandleNNError(f"cannot write {shown(dest)}: {exc.strerror or exc}") from exc
            finally:
                for tmp, _, _ in self._staged[len(done):]:
                    remove_quietly(tmp)
                self._staged.clear()
            return done

    def record(self, paths: "list[Path]", source: "str | os.PathLike") -> None:
        """Add files a writer renamed into the run folder itself (a video) to its file list."""
        with self._lock:
            for path in paths:
                self._committed.add(path)
                info = os.stat(path)
                self._manifest[path.relative_to(self.path).as_posix()] = {
                    "image": shown(source), "size": info.st_size, "mtime_ns": info.st_mtime_ns}
            try:
                self._write_manifest()
            except OSError as exc:
                raise CandleNNError(f"cannot write {shown(self.path / MANIFEST)}: "
                                    f"{exc.strerror or exc}") from exc

    def _remove_replaced(self, images: set[str]) -> None:
        """An earlier run's files of ``images`` that this run did not write again."""
        for rel, entry in list(self._manifest.items()):
            path = self.path / rel
            if entry.get("image") in images and path not in self._committed:
                if self._ours(path):
                    remove_quietly(path)
                    _remove_empty_parents(path.parent, self.path)
                del self._manifest[rel]

    def _write_manifest(self) -> None:
        doc = {"written_by": "candle_nn", "files": self._manifest}
        with atomic_write(self.path / MANIFEST) as tmp:
            tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=True), encoding="utf-8")

    def abort(self) -> None:
        """Remove every staged file (and the folders this run made, when they are empty)."""
        with self._lock:
            for tmp, _, _ in self._staged:
                remove_quietly(tmp)
            self._staged.clear()
            interrupt.forget(self.abort)
            self._remove_empty_made()

    def finish(self) -> None:
        """End of a run: nothing staged is left; folders made for nothing are removed."""
        self.abort()

    def _remove_empty_made(self) -> None:
        made = sorted(set(self._made), key=lambda p: len(p.parts), reverse=True)
        for folder in made + ([] if self._existed else [self.path]):
            try:
                folder.rmdir()  # only when empty
            except OSError:
                pass


def _remove_empty_parents(folder: Path, root: Path) -> None:
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent
