"""Concatenation along the last axis (the channels of NHWC maps)."""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx

from .registry import op


@op("concat_last")
def concat_last(xs: Sequence[mx.array]) -> mx.array:
    """``xs`` ``(..., C_i)``, equal on every other axis → ``(..., sum C_i)``: YOLO's channel
    concatenations (C2f, SPPF, the PAN neck)."""
    return mx.concatenate(list(xs), axis=-1)
