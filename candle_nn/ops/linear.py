"""The affine map ``x @ W.T + b`` with a fused epilogue."""

from __future__ import annotations

import mlx.core as mx

from .activation import bias_act
from .registry import op


@op("linear")
def linear(x: mx.array, weight: mx.array, bias: mx.array | None = None,
           activation: str | None = None, residual: mx.array | None = None) -> mx.array:
    """``activation(x @ weight.T + bias) [+ residual]``: ``x`` ``(..., in)``, ``weight``
    ``(out, in)``, ``bias`` ``(out,)``, ``residual`` the output's shape ``(..., out)``."""
    y = mx.addmm(bias, x, weight.T) if bias is not None else x @ weight.T
    return bias_act(y, None, activation, residual, residual_after_activation=True)
