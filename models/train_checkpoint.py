"""Reading a trainer's checkpoint: a safetensors file whose metadata holds the run's state as
JSON under one key (``format`` 1). The trainers write it with
:func:`candle_nn.checkpoint.write_safetensors`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from candle_nn import CandleNNError, WeightsFileError  # first: sets MLX's CPU BLAS up
import mlx.core as mx

__all__ = ["read_checkpoint"]


def read_checkpoint(path: "str | os.PathLike", key: str,
                    kind: str = "training") -> tuple[dict[str, mx.array], dict[str, Any]]:
    """The tensors and the state (``json.loads`` of metadata ``key``) of the checkpoint at
    ``path``; :class:`CandleNNError` when it is absent, :class:`WeightsFileError` when it is not
    a ``kind`` checkpoint of this version. The messages name ``--resume``."""
    path = Path(path)
    if not path.is_file():
        raise CandleNNError(f"no checkpoint to resume at {path}: start the run without --resume")
    try:
        tensors, metadata = mx.load(os.fspath(path), return_metadata=True)
        meta = json.loads(metadata[key])
    except (KeyError, ValueError, RuntimeError, OSError) as exc:
        raise WeightsFileError(f"{path} is not a readable training checkpoint ({exc}); start "
                               "the run again without --resume") from exc
    if not isinstance(meta, dict) or meta.get("format") != 1:
        raise WeightsFileError(f"{path} is not a {kind} checkpoint of this version")
    return tensors, meta
