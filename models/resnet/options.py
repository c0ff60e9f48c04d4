"""The ResNet task API's predict options, each with its one default and help: ``Classifier.predict``
takes them as keyword arguments, and ``candle-resnet`` generates its options from the same fields
(``metadata``: the command-line ``flag``; ``cli=False``: the CLI defines the flag elsewhere, with
this default)."""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import Any

from candle_nn import CandleNNError

from candle_nn_models.image_decode import DEFAULT_MAX_PIXELS
from candle_nn_models.task_options import options_from_keywords

__all__ = ["PredictOptions"]


def _option(default: int, flag: str, help: str, cli: bool = True) -> Any:
    return field(default=default, metadata={"flag": flag, "help": help, "cli": cli})


@dataclass(frozen=True)
class PredictOptions:
    """What ``Classifier.predict`` does with its images; every option is a whole number >= 1 (else
    one :class:`~candle_nn.CandleNNError` naming it)."""

    top_k: int = _option(5, "--top-k", "labels printed per image (default {default})")
    batch_size: int = _option(8, "--batch-size", "images per forward (default {default})")
    max_pixels: int = _option(DEFAULT_MAX_PIXELS, "--max-pixels",
                              "refuse images with more pixels than this", cli=False)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise CandleNNError(f"{f.name}={value!r}: pass a whole number >= 1")

    @classmethod
    def from_keywords(cls, options: dict[str, Any]) -> "PredictOptions":
        """The options from ``predict``'s keyword arguments; an unknown one is an error listing
        the known ones."""
        return options_from_keywords(cls, options)
