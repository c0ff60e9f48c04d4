"""Reading a trainer's checkpoint: a safetensors file whose metadata holds the run's state as
JSON under one key (``format`` 1). The trainers write it with
:func:`candle_nn.checkpoint.write_safetensors`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from candle_nn import CandleNNError, WeightsFileError  # first: sets MLX's CPU BLAS up
import mlx.core as mx

__all__ = ["read_checkpoint"]


def read_checkpoint(path: "str | os.PathLike", key: str, kind: str = "training",
                    required: Sequence[str] = ()) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """The tensors and the state (``json.loads`` of metadata ``key``) of the checkpoint at
    ``path``; :class:`CandleNNError` when it is absent, :class:`WeightsFileError` when it is not
    a ``kind`` checkpoint of this version (no state, say a weights file; or a state without the
    ``required`` fields). The messages name ``--resume``."""
    path = Path(path)
    again = "start the run again without --resume, into another --out"
    if not path.is_file():
        raise CandleNNError(f"no checkpoint to resume at {path}: start the run without --resume")
    try:
        tensors, metadata = mx.load(os.fspath(path), return_metadata=True)
    except (ValueError, RuntimeError, OSError) as exc:
        raise WeightsFileError(f"{path} is not a readable safetensors file ({exc}); "
                               f"{again}") from exc
    if key not in metadata:
        raise WeightsFileError(f"{path} is not a {kind} checkpoint: it holds no training state "
                               f"(a weights file?); {again}")
    try:
        meta = json.loads(metadata[key])
    except ValueError as exc:
        raise WeightsFileError(f"{path} is not a readable {kind} checkpoint: its training state "
                               f"is not JSON ({exc}); {again}") from exc
    missing = ([k for k in required if k not in meta] if isinstance(meta, dict)
               else list(required))
    if not isinstance(meta, dict) or meta.get("format") != 1 or missing:
        lacks = f" (its state lacks {', '.join(missing)})" if missing else ""
        raise WeightsFileError(f"{path} is not a {kind} checkpoint of this version{lacks}; "
                               f"{again}")
    return tensors, meta
