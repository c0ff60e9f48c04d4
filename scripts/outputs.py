"""A run's output files, written together or not at all.

Each file is written in full to a hidden temporary file beside its destination (``.<name>-XXXX``)
and renamed into place only when the whole run succeeds (:meth:`OutputFolder.commit`). A failed
image drops just its own files (:meth:`OutputFolder.rollback`); a fatal error, Ctrl-C or SIGTERM
removes every staged file (:meth:`OutputFolder.abort`). So no output is ever half-written, and an
image whose overlay could not be written leaves no mask either.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from candle_nn import CandleNNError
from candle_nn.atomic_write import remove_quietly, temp_beside
from candle_nn_models.scripts import interrupt

_PIL_FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".webp": "WEBP"}


class OutputFolder:
    """The ``--out`` folder of one run. Checked when made (exists and writable, or creatable);
    created only when the first file is staged, so a run that writes nothing leaves no folder."""

    def __init__(self, path: "str | os.PathLike") -> None:
        self.path = Path(path)
        self._check()
        self._existed = self.path.exists()
        self._made: list[Path] = []  # subfolders made for staged files (removed on abort if empty)
        self._staged: list[tuple[Path, Path]] = []  # (temporary file, destination), in order
        self._lock = threading.Lock()  # an interrupt waits for a commit in progress
        interrupt.on_interrupt(self.abort)

    def _check(self) -> None:
        probe = self.path
        while not probe.exists():
            if probe.is_symlink() or probe.parent == probe:
                break
            probe = probe.parent
        if not probe.is_dir():
            raise CandleNNError(f"cannot create output folder {self.path}: {probe} is not a "
                                "folder; pass another --out DIR")
        if not os.access(probe, os.W_OK | os.X_OK):
            where = "" if probe == self.path else f" (folder {probe} is not writable)"
            raise CandleNNError(f"output folder {self.path} is not writable{where}; "
                                "pass another --out DIR")

    def create(self) -> Path:
        """Make the folder now (for writers that stage their own files); returns its path."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CandleNNError(f"cannot create output folder {self.path}: "
                                f"{exc.strerror or exc}") from exc
        return self.path

    def save_image(self, image, name: str) -> Path:
        """Stage a PIL ``image`` as ``<out>/<name>`` (format from the suffix: JPEG quality 95,
        PNG, BMP, WebP; anything else PNG). A name already staged in this run gets a number
        (``bike_detect-1.jpg``). Returns the final path."""
        fmt = _PIL_FORMATS.get(Path(name).suffix.lower(), "PNG")
        options = {"quality": 95} if fmt == "JPEG" else {}
        return self._stage(name, lambda fh: image.save(fh, format=fmt, **options))

    def save_text(self, text: str, name: str) -> Path:
        """Stage ``text`` (UTF-8) as ``<out>/<name>``. Returns the final path."""
        return self._stage(name, lambda fh: fh.write(text.encode("utf-8")))

    def _stage(self, name: str, write) -> Path:
        dest, n = self.path / name, 1
        while any(dest == staged for _, staged in self._staged):  # two inputs, one stem
            dest, n = self.path / f"{Path(name).stem}-{n}{Path(name).suffix}", n + 1
        try:
            missing = dest.parent
            while not missing.is_dir() and missing != missing.parent:
                self._made.append(missing)
                missing = missing.parent
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = temp_beside(dest)
        except OSError as exc:
            raise CandleNNError(f"cannot write {dest}: {exc.strerror or exc}") from exc
        with self._lock:
            self._staged.append((tmp, dest))
        try:
            with open(tmp, "wb") as fh:
                write(fh)
        except OSError as exc:
            raise CandleNNError(f"cannot write {dest}: {exc.strerror or exc}") from exc
        return dest

    def mark(self) -> int:
        """A point to :meth:`rollback` to (the number of files staged so far)."""
        return len(self._staged)

    def rollback(self, mark: int) -> None:
        """Drop the files staged since ``mark``."""
        with self._lock:
            for tmp, _ in self._staged[mark:]:
                remove_quietly(tmp)
            del self._staged[mark:]

    def commit(self) -> list[Path]:
        """Rename every staged file into place; returns the destinations."""
        with self._lock:
            done = []
            try:
                for tmp, dest in self._staged:
                    os.replace(tmp, dest)
                    done.append(dest)
            except OSError as exc:
                raise CandleNNError(f"cannot write {dest}: {exc.strerror or exc}") from exc
            finally:
                for tmp, _ in self._staged[len(done):]:
                    remove_quietly(tmp)
                self._staged.clear()
            return done

    def abort(self) -> None:
        """Remove every staged file (nothing of this run is left, nor the folder it created)."""
        with self._lock:
            for tmp, _ in self._staged:
                remove_quietly(tmp)
            self._staged.clear()
            interrupt.forget(self.abort)
            made = sorted(set(self._made), key=lambda p: len(p.parts), reverse=True)
            for folder in made + ([] if self._existed else [self.path]):
                try:
                    folder.rmdir()  # only when empty
                except OSError:
                    pass

