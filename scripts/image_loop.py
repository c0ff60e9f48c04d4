"""One model CLI run over many images that survives bad ones (``candle-nn-batch``, the Ray Data
job, is :mod:`candle_nn_models.scripts.batch`).

    with Batch(args) as batch:                # args: add_input_arguments' options
        todo = batch.start()                  # lists --image; unusable inputs reported, skipped
        if todo:
            model = ...                       # load only when there is work
            batch.doc["model"] = ...          # top-level fields of the --json document
            batch.output = OutputFolder(args.out)   # optional: each image's files committed
            for path in batch.progress(todo):
                with batch.image(path):       # an ImageError here: reported, skipped
                    ...
                    batch.done(result_dict, text_lines)
    return batch.exit_code

A failed image is one ``error: <path>: <reason>`` line on stderr and an ``errors`` entry in the
JSON document; its staged output files are dropped. A good image's files are renamed into place
when it is done, before its lines are printed (so every path printed exists); ``--strict`` turns
the first failure into a fatal error and holds stdout and the files until the run has succeeded.
At the end ``--json`` prints its one document, and a run of several images prints
``N images: k ok, f failed`` on stderr. Exit status 0 when any image succeeded, else 1. A fatal
error (weights, device, a write, Ctrl-C) removes every staged file and, with ``--json``, still
prints the document (with the error) before re-raising. Progress (``i/N``, ms per image) goes to
stderr through tqdm, only when it is a terminal.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from tqdm import tqdm

from candle_nn import CandleNNError, ImageError
from candle_nn.cli import print_json_document
from candle_nn_models.scripts import interrupt
from candle_nn_models.scripts.common import ImageInputError, shown
from candle_nn_models.scripts.input_paths import expand_image_args
from candle_nn_models.scripts.outputs import OutputFolder


class Batch:
    """The state of one run: inputs, results, errors, staged outputs, progress bar."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.strict: bool = args.strict
        self.json: bool = args.json
        self.doc: dict = {}
        self.results: list[dict] = []
        self.errors: list[dict] = []
        self.total = 0
        self.output: OutputFolder | None = None
        self.exit_code = 1
        self._bar: tqdm | None = None
        self._started = 0.0
        self._held: list[str] = []  # --strict: stdout lines held until the run succeeds
        self._pending: list[str] | None = None  # the current image's lines, until committed
        if self.json:  # Ctrl-C / SIGTERM end the process from the signal thread: say so first
            interrupt.on_interrupt(self._on_signal)

    def __enter__(self) -> "Batch":
        return self

    def start(self) -> list[Path]:
        """Expand ``--image``; report the inputs that cannot be used; the paths to process."""
        inputs = expand_image_args(self.args.image, recursive=self.args.recursive)
        if not inputs:
            raise CandleNNError("no image given: pass --image PATH (files, folders, globs, or - "
                                "to read paths from stdin)")
        self.total = len(inputs)
        for item in inputs:
            if item.error:
                self.fail(ImageInputError(item.path, item.error))
        return [item.path for item in inputs if not item.error]

    def progress(self, paths: Sequence[Path]) -> Iterator[Path]:
        """Iterate ``paths`` with a progress bar on stderr (terminal only, runs of 2+ images)."""
        with tqdm(paths, unit="img", file=sys.stderr, dynamic_ncols=True,
                  disable=True if len(paths) < 2 else None) as bar:
            self._bar, self._started = bar, time.perf_counter()
            try:
                yield from bar
            finally:
                self._bar = None

    @contextmanager
    def image(self, path: Path, *, errors: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
        """Run one image's work: an :class:`ImageError` (or one of ``errors``) or running out of
        memory fails this image only, dropping the files it staged; anything else is fatal."""
        mark = self.output.mark() if self.output else 0
        self._pending = []
        try:
            yield
        except (ImageError, MemoryError, *errors) as exc:
            if self.output:
                self.output.rollback(mark)
            if isinstance(exc, MemoryError):
                exc = ImageInputError(path, "out of memory while processing this image")
            elif not isinstance(exc, ImageInputError):
                exc = ImageInputError(path, str(exc))
            self.fail(exc)
        else:
            if self.output and not self.strict:  # its lines name files that are on disk
                self.output.commit()
            self._flush(self._pending)
        finally:
            self._pending = None

    def fail(self, exc: ImageInputError) -> None:
        """Record and report one failed image (fatal under ``--strict``)."""
        if self.strict:
            raise exc
        self.errors.append({"path": shown(exc.path), "reason": exc.reason})
        self.write(f"error: {exc}", sys.stderr)

    def done(self, result: dict, lines: Iterable[str] = ()) -> None:
        """One image succeeded: ``result`` goes into the JSON document, ``lines`` to stdout."""
        self.results.append(result)
        if self._pending is not None:  # inside image(): printed once its files are in place
            self._pending.extend(lines)
        else:
            self._flush(lines)
        if self._bar is not None:
            ms = 1000 * (time.perf_counter() - self._started) / len(self.results)
            self._bar.set_postfix_str(f"{ms:.0f} ms/img", refresh=False)

    def _flush(self, lines: Iterable[str]) -> None:
        if self.strict:  # printed only if the whole run succeeds (else nothing is written)
            self._held.extend(lines)
        elif not self.json:
            for line in lines:
                self.write(line, sys.stdout)

    def write(self, line: str, stream) -> None:
        """Print a line without garbling the progress bar."""
        if self._bar is not None and not self._bar.disable:
            tqdm.write(line, file=stream)
        else:
            print(line, file=stream)

    def _on_signal(self) -> None:
        self._print_doc(KeyboardInterrupt())

    def __exit__(self, kind, exc, tb) -> bool:
        interrupt.forget(self._on_signal)
        if exc is None:
            if self.output:
                try:
                    self.output.commit()
                except CandleNNError as error:
                    self.output.abort()
                    self._print_doc(error)
                    raise
                self.output.finish()
            if not self.json:
                for line in self._held:
                    print(line)
            self._print_doc()
            ok, failed = len(self.results), len(self.errors)
            if self.total > 1:
                print(f"{self.total} images: {ok} ok, {failed} failed", file=sys.stderr)
            self.exit_code = 0 if ok else 1
            return False
        if self.output:
            self.output.abort()
        if isinstance(exc, (CandleNNError, KeyboardInterrupt)):
            self._print_doc(exc)
        return False  # the error goes on to run_main: one `error: …` line

    def _print_doc(self, fatal: BaseException | None = None) -> None:
        if not self.json:
            return
        errors = list(self.errors)
        if fatal is not None:
            path = getattr(fatal, "path", None)
            errors.append({"path": None if path is None else shown(path),
                           "reason": getattr(fatal, "reason", None) or str(fatal) or "interrupted",
                           "fatal": True})
        doc = {**self.doc, "images": self.results, "errors": errors,
               "summary": {"images": self.total, "ok": len(self.results),
                           "failed": self.total - len(self.results)}}
        print_json_document(doc)
