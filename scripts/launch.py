"""Console entry points of the model CLIs: signals are handled first
(:mod:`candle_nn_models.scripts.interrupt`), then the CLI module — and with it MLX, models and
weights — is imported, so a Ctrl-C at any moment ends the program with one line and exit status
130."""

from __future__ import annotations

import importlib
import sys

from candle_nn_models.scripts import interrupt


def _run(module: str) -> int:
    interrupt.install()
    try:
        return importlib.import_module(module).main()
    except KeyboardInterrupt:  # a signal that arrived before install() took effect
        print("error: interrupted", file=sys.stderr)
        return 130


def resnet() -> int:
    """``candle-resnet``."""
    return _run("candle_nn_models.scripts.resnet")


def yolo_v8() -> int:
    """``candle-yolo-v8``."""
    return _run("candle_nn_models.scripts.yolo_v8")


def segment_anything() -> int:
    """``candle-segment-anything``."""
    return _run("candle_nn_models.scripts.segment_anything")


def app() -> int:
    """``candle-nn-app``."""
    return _run("candle_nn_models.scripts.app")
