"""Dropout: zeroes elements at random in training, the identity in evaluation."""

from __future__ import annotations

import mlx.core as mx

from .module import Module


class Dropout(Module):
    """PyTorch's ``Dropout``: in ``train()`` mode each element is zeroed with probability ``p``
    and the rest scaled by ``1 / (1 - p)``; in ``eval()`` mode the identity.

    The mask is drawn from MLX's random generator: ``mx.random.seed(n)`` makes it reproducible
    (under ``mx.compile``, pass ``mx.random.state`` as an input and output). Like every MLX module
    it is built in train mode; models' ``load`` return them in eval mode. Input any shape → same.
    """

    def __init__(self, p: float = 0.5) -> None:
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout probability must be in [0, 1), got {p}")
        super().__init__(None)
        self.p = float(p)

    def forward(self, x: mx.array) -> mx.array:
        if not self.training or self.p == 0.0:
            return x
        keep = mx.random.bernoulli(1.0 - self.p, x.shape)
        return x * (keep.astype(x.dtype) * (1.0 / (1.0 - self.p)))
