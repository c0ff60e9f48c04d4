"""What every command-line program of this project shares: :func:`run_main`, the error contract.

A library error (:class:`~candle_nn.errors.CandleNNError`) is one ``error: …`` line on stderr and
exit status 1, never a traceback; Ctrl-C is ``error: interrupted`` and status 130. It lives here,
below ``models/``, ``weights/`` and ``scripts/``, so that every layer's programs (the model CLIs,
``candle-nn-weights``) can use it without importing a layer above their own.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Sequence

from .errors import CandleNNError


def run_main(main: Callable[[Sequence[str] | None], int],
             argv: Sequence[str] | None = None) -> int:
    """Run a CLI body: library errors become one ``error: …`` line on stderr and exit status 1.

    stdout/stderr escape what their encoding cannot show (a file name that is not UTF-8, an
    ASCII-only terminal) instead of raising ``UnicodeEncodeError``; a closed pipe (``| head``)
    ends the program quietly."""
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
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
