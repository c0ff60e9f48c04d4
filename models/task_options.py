"""What every task API's options dataclass shares: building it from ``predict``'s keyword
arguments, an unknown keyword being one error that lists the known ones."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from candle_nn import CandleNNError

T = TypeVar("T")


def options_from_keywords(cls: type[T], options: dict[str, Any]) -> T:
    """``cls(**options)`` for a dataclass ``cls``; an unknown keyword is a CandleNNError naming
    it and the known ones."""
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise CandleNNError(f"unknown predict option {unknown[0]!r}: the options are "
                            f"{', '.join(known)}")
    return cls(**options)
