"""Backend implementations of candle_nn's ops, one folder per backend; importing registers them
(``candle_nn.ops`` does)."""

from __future__ import annotations

from . import cpu, cuda  # noqa: F401
