"""``candle-yolo-v8``'s predict options: generated from
:class:`~candle_nn_models.yolo.PredictOptions` (flags, defaults, help) and read back from the
parsed command line as ``YOLO.predict``'s keyword arguments."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from candle_nn_models.yolo import PredictOptions
from candle_nn_models.scripts.common import fraction, number_arg, positive, yolo_input_size


def _class_id(text: str) -> int:
    value = number_arg(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a class id (0, 1, 2, ...)")
    return value


# PredictOptions' value kinds -> the argparse keywords that parse them
_KINDS: dict[str, dict[str, Any]] = {
    "fraction": {"type": fraction}, "size": {"type": yolo_input_size},
    "count": {"type": positive(int)},
    "class_ids": {"type": _class_id, "nargs": "+", "metavar": "N"},
    "switch": {"action": "store_true"}}


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_predict_arguments(parser, group: str) -> None:
    """The options of :class:`PredictOptions` in help ``group`` (``main`` or ``ultralytics``),
    each with its field's flag, default and help."""
    for f in dataclasses.fields(PredictOptions):
        meta = f.metadata
        if meta["cli"] and meta["group"] == group:
            kind = dict(_KINDS[meta["kind"]])
            if meta["kind"] != "switch":
                kind["default"] = f.default
            parser.add_argument(meta["flag"], help=meta["help"].format(default=f.default),
                                **kind)


def predict_options(args: argparse.Namespace) -> dict[str, Any]:
    """``YOLO.predict``'s keyword arguments from the parsed command line."""
    return {f.name: getattr(args, _dest(f.metadata["flag"]))
            for f in dataclasses.fields(PredictOptions)}
