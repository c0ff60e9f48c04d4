"""The activations in float64 NumPy: the reference every kernel and op test compares against."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf

__all__ = ["ACTIVATIONS", "activation64"]

ACTIVATIONS = {
    "relu": lambda v: np.maximum(v, 0),
    "silu": lambda v: v / (1 + np.exp(-v)),
    "gelu": lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2))),
    "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
}


def activation64(v: np.ndarray, name: str | None) -> np.ndarray:
    """Activation ``name`` (a key of :data:`ACTIVATIONS`; ``None``, ``"none"`` or
    ``"identity"``: none) of ``v`` in float64."""
    v = np.asarray(v, dtype=np.float64)
    if name in (None, "none", "identity"):
        return v
    return ACTIVATIONS[name](v)
