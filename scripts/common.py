"""Pieces every model CLI shares: the input options, the argparse number checks, device parsing,
:func:`environment_restored`, and (re-exported from :mod:`candle_nn_models.image_file`,
:mod:`candle_nn_models.finite` and :mod:`candle_nn.cli`) safe image loading, the non-finite
output check and the one-clear-line error
handling (``error: …`` on stderr, exit status 1; 130 on Ctrl-C). Inputs are listed by
:mod:`candle_nn_models.scripts.input_paths`, runs over many images are driven by
:mod:`candle_nn_models.scripts.image_loop`, and output files are written by
:mod:`candle_nn_models.scripts.outputs` (``candle-nn-batch``'s Parquet output folder by
:func:`prepare_out_dir`)."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from pathlib import Path
from typing import Iterator

from candle_nn import CandleNNError, Device
from candle_nn.blas import warn_if_slow_cpu
from candle_nn.cli import run_main  # noqa: F401  (re-exported: every CLI's entry wrapper)
from candle_nn_models.image_decode import DEFAULT_MAX_PIXELS
from candle_nn_models.training_size import MAX_YOLO_INPUT_SIZE
# re-exported: the non-finite output check, the per-image error and the safe image reading
# that every CLI uses (the task APIs use them too)
from candle_nn_models.finite import check_finite  # noqa: F401
from candle_nn_models.image_file import ImageInputError, load_rgb, shown  # noqa: F401


def add_input_arguments(parser: argparse.ArgumentParser, *, what: str = "results",
                        required: bool = True) -> None:
    """The options every model CLI shares for its inputs and its report: ``--image`` (files,
    folders, globs, ``-`` for stdin), ``--recursive``, ``--strict``, ``--max-pixels``,
    ``--json``."""
    parser.add_argument(
        "--image", nargs="+", action="extend", required=required, metavar="PATH",
        help="image files, folders, glob patterns ('photos/*.jpg'; '**' spans folders) or - to "
             "read paths from stdin, one a line (several after one --image, or repeat --image)")
    parser.add_argument("--recursive", action="store_true",
                        help="also take the images in the subfolders of a folder given to --image")
    parser.add_argument("--strict", action="store_true",
                        help="stop at the first image that cannot be read or processed (exit 1, "
                             "nothing written); default: report it on stderr, skip it, go on")
    parser.add_argument("--max-pixels", type=pixel_count, default=DEFAULT_MAX_PIXELS, metavar="N",
                        help="refuse images with more pixels than this, a guard against "
                             f"decompression bombs (default {DEFAULT_MAX_PIXELS}, ~179 Mpx)")
    parser.add_argument("--json", action="store_true",
                        help=f"print the {what} as one JSON document on stdout, with an "
                             "\"errors\" list of the images that failed")


def add_output_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    """``--out DIR`` (the run folder; a fresh ``DIR2``, ``DIR3``, … when it is taken) and
    ``--exist-ok`` (write into ``DIR`` even so), as ultralytics' ``project/name`` and
    ``exist_ok``; see :mod:`candle_nn_models.scripts.outputs`."""
    parser.add_argument("--out", default=None, metavar="DIR",
                        help=f"run folder for the output files (default {default}); when it "
                             "exists and is not empty, a fresh DIR2, DIR3, ... is used")
    parser.add_argument("--exist-ok", action="store_true",
                        help="write into --out even when it is not empty: files this program "
                             "wrote there before are replaced, other files are never touched")


def number_arg(text: str, kind: type = float) -> "int | float":
    """``text`` as a finite ``kind`` (``int`` or ``float``), for the CLIs' argparse ``type=``
    checks: anything else is an ArgumentTypeError saying what was expected (argparse's own
    message for a ValueError would name the checking function instead)."""
    try:
        value = kind(text)
    except ValueError:
        expected = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {expected}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def resumable_parser(prog: str, description: str, suppress: bool = False):
    """A training command's ``(parser, d)``: ``d(value)`` gives an option's ``default=`` keyword;
    with ``suppress`` no option has a default, so the parsed namespace holds only the options the
    command line gave (what ``--resume`` checks against the run's settings)."""
    parser = argparse.ArgumentParser(
        prog=prog, argument_default=argparse.SUPPRESS if suppress else None,
        description=description)
    d = (lambda value: {}) if suppress else (lambda value: {"default": value})
    return parser, d


def positive(kind: type = float):
    """An argparse ``type=`` for a number above 0 of ``kind`` (see :func:`number_arg`)."""
    def check(text: str) -> "int | float":
        value = number_arg(text, kind)
        if value <= 0:
            what = "whole number" if kind is int else "number"
            raise argparse.ArgumentTypeError(f"{text} is not a positive {what}")
        return value
    return check


def non_negative(text: str) -> int:
    """An argparse ``type=`` for a whole number >= 0 (epochs, seeds)."""
    value = number_arg(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number >= 0")
    return value


def fraction(text: str) -> float:
    """An argparse ``type=`` for a number in [0, 1] (confidence and IoU thresholds)."""
    value = number_arg(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not in [0, 1]")
    return value




def yolo_input_size(text: str) -> int:
    """An argparse ``type=`` for a YOLO input side: a positive multiple of 32 up to
    :data:`MAX_YOLO_INPUT_SIZE`."""
    value = number_arg(text, int)
    if value <= 0 or value % 32:
        raise argparse.ArgumentTypeError(f"{text} is not a positive multiple of 32")
    if value > MAX_YOLO_INPUT_SIZE:
        raise argparse.ArgumentTypeError(
            f"{text} is above {MAX_YOLO_INPUT_SIZE}: YOLOv8 is trained at 640, and the work grows "
            "with the square of the size (try 640, 1280 or at most 4096)")
    return value


def pixel_count(text: str) -> int:
    """An argparse ``type=`` for ``--max-pixels``: a positive number of pixels."""
    value = number_arg(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of pixels")
    return int(value)


def prepare_out_dir(path: "str | os.PathLike") -> Path:
    """Create ``path`` if needed and check it is a writable folder (CandleNNError otherwise)."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CandleNNError(f"cannot create output folder {out}: {exc.strerror or exc}") from exc
    if not out.is_dir() or not os.access(out, os.W_OK | os.X_OK):
        raise CandleNNError(f"output folder {out} is not writable; pass another --out DIR")
    return out


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device cpu|gpu|gpu:N`` (default: GPU when MLX has one, else CPU) and ``--verbose``."""
    parser.add_argument("--device", default=None,
                        help="cpu, gpu or gpu:N (default: the GPU when MLX has one, else the CPU)")
    parser.add_argument("--verbose", action="store_true",
                        help="print the MLX version, devices, CPU BLAS and float32 precision "
                             "in use (to stderr)")
    parser.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                        help="run the model under mx.compile (auto, the default: on GPUs, where "
                             "it is faster; off on the CPU, where it is slower)")


def compile_choice(choice: str) -> bool | None:
    """``--compile`` as :meth:`candle_nn.Module.set_compiled`'s argument (``auto`` → ``None``)."""
    return {"auto": None, "on": True, "off": False}[choice]


def parse_device(spec: str | None, verbose: bool = False) -> Device:
    """The device named on the command line (DeviceUnavailableError when absent); with
    ``verbose``, the runtime summary (``candle_nn.info()``) goes to stderr first."""
    if verbose:
        from candle_nn import info

        print(info(), file=sys.stderr)
    device = Device.default() if spec is None else Device.parse(spec)
    warn_if_slow_cpu(device)
    return device


@contextlib.contextmanager
def environment_restored() -> Iterator[None]:
    """``os.environ`` on exit as it was on entry: around libraries that set variables in the
    calling process (``ray.init`` sets ``PYTHONBREAKPOINT`` to Ray's debugger and
    ``RAY_AUTH_MODE``, and ``ray.shutdown`` leaves them), so that a CLI called as a function
    changes nothing of its caller's environment, nor of the programs that caller starts later."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(before):
            del os.environ[name]
        for name, value in before.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
