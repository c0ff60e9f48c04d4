"""Embedding table lookup."""

from __future__ import annotations

import mlx.core as mx

from . import ops
from .device import Device
from .errors import DTypeError, OutOfRangeError
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
        """``ids`` ``(...)`` integers in ``[0, num_embeddings)`` → ``(..., dim)``. An id outside
        the table is an error (as candle's and PyTorch's), checked on concrete ids; inside
        ``mx.compile`` the ids have no values yet and the lookup runs unchecked."""
        n = self.weight.shape[0]
        if not mx.issubdtype(ids.dtype, mx.integer):
            raise DTypeError(f"Embedding takes integer ids, got {ids.dtype}: "
                             "ids.astype(mx.int32)")
        if ids.size and not ops.registry.is_tracer(ids):
            outside = (ids < 0) | (ids >= n)
            if outside.any().item():
                bad = int(ids.reshape(-1)[mx.argmax(outside.reshape(-1))].item())
                raise OutOfRangeError(f"Embedding of {n} rows got id {bad}: ids must be in "
                                      f"[0, {n})")
        return mx.take(self.weight, ids, axis=0)
