"""What every command-line program of this project shares: :func:`run_main`, the error contract,
and the ``--json`` contract.

A library error (:class:`~candle_nn.errors.CandleNNError`) is one ``error: …`` line on stderr and
exit status 1, never a traceback; Ctrl-C is ``error: interrupted`` and status 130. With ``--json``
on the command line, stdout always carries one JSON document: the program's own, or — after a
usage error (:class:`ArgumentParser`, exit status 2) or a fatal error before it printed one —
``{"images": [], "errors": [{"path": null, "reason": …, "fatal": true}], "summary": …}``.
It lives here, below ``models/``, ``weights/`` and ``scripts/``, so that every layer's programs
(the model CLIs, ``candle-nn-weights``) can use it without importing a layer above their own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, NoReturn, Sequence

from .errors import CandleNNError

_document_printed = False


def json_requested(argv: Sequence[str] | None) -> bool:
    """Whether ``argv`` (default ``sys.argv[1:]``) asks for ``--json`` (argparse also accepts an
    unambiguous prefix such as ``--js``); arguments after ``--`` do not count."""
    for token in sys.argv[1:] if argv is None else argv:
        token = os.fsdecode(token) if isinstance(token, bytes) else str(token)
        if token == "--":
            return False
        if token.startswith("--j") and "--json".startswith(token.split("=", 1)[0]):
            return True
    return False


def print_json_document(doc: dict) -> None:
    """Print the run's one JSON document on stdout (and note that it was printed)."""
    global _document_printed
    print(json.dumps(doc, indent=2, ensure_ascii=True), flush=True)
    _document_printed = True


def printable(text: str) -> str:
    """``text`` safe to print within one line of a terminal or a text file: every character that
    is not printable (C0 and C1 controls such as ESC, CR and newline, DEL, line and paragraph
    separators, bidirectional overrides) becomes its Python escape (``\\x1b``, ``\\n``,
    ``\\u202e``), so a name read from a file cannot move the cursor, recolour the terminal or
    start a line of its own; every other character, non-ASCII letters included, is kept. JSON
    output keeps the text exact (``json.dumps`` escapes these itself)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def error_document(reason: str) -> dict:
    """The JSON document of a run that ended before any image: one fatal error."""
    return {"images": [], "errors": [{"path": None, "reason": reason, "fatal": True}],
            "summary": {"images": 0, "ok": 0, "failed": 0}}


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors (exit status 2, message on stderr as
    argparse prints it) also print the JSON document when ``--json`` is on the command line."""

    _argv: list[str] | None = None

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        if json_requested(self._argv) and not _document_printed:
            print_json_document(error_document(f"{self.prog}: {message}"))
        super().error(message)


def run_main(main: Callable[[Sequence[str] | None], int],
             argv: Sequence[str] | None = None, *, json_document: bool = True) -> int:
    """Run a CLI body: library errors become one ``error: …`` line on stderr and exit status 1.

    stdout/stderr escape what their encoding cannot show (a file name that is not UTF-8, an
    ASCII-only terminal) instead of raising ``UnicodeEncodeError``; a closed pipe (``| head``)
    ends the program quietly. With ``--json`` (when ``json_document``: a CLI whose ``--json``
    asks for its results as a JSON document on stdout), a fatal error that left no JSON document
    on stdout prints :func:`error_document`."""
    global _document_printed
    _document_printed = not json_document  # False: a document is still owed
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass
    try:
        return int(main(argv) or 0)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except CandleNNError as exc:
        _document_on_error(argv, str(exc))
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _document_on_error(argv, "interrupted")
        print("error: interrupted", file=sys.stderr)
        return 130


def _document_on_error(argv: Sequence[str] | None, reason: str) -> None:
    if json_requested(argv) and not _document_printed:
        print_json_document(error_document(reason))
