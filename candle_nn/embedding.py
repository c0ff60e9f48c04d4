"""Embedding table lookup."""

from __future__ import annotations

import mlx.core as mx

from .device import Device
from .init import Init
from .module import Module
from .var_builder import VarBuilder


class Embedding(Module):
    """Rows of a ``(num_embeddings, dim)`` table: integer ids ``(...)`` → ``(..., dim)``."""

    def __init__(self, weight: mx.array, *, device: Device) -> None:
        super().__init__(device)
        self.weight = weight

    @classmethod
    def load(cls, vb: VarBuilder, num_embeddings: int, dim: int) -> "Embedding":
        """Read ``weight`` ``(num_embeddings, dim)``; fresh tables are Normal(0, 1)."""
        weight = vb.get((num_embeddings, dim), "weight", Init.normal(0.0, 1.0))
        return cls(weight, device=vb.device).loaded_from(vb)

    def candle_tensors(self, prefix: str) -> dict[str, mx.array]:
        """``weight`` ``(num_embeddings, dim)`` under ``prefix``."""
        return {f"{prefix}.weight": self.weight}

    @property
    def embeddings(self) -> mx.array:
        return self.weight

    def forward(self, ids: mx.array) -> mx.array:
        return mx.take(self.weight, ids, axis=0)
