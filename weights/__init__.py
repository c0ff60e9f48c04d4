"""Checkpoints for candle_nn's models: the registry of candle's published files
(:func:`resolve_weights`), the ``candle_nn.*`` safetensors metadata of converted files
(:func:`read_metadata`), and the ``candle-nn-weights`` tool (:mod:`weights.cli`). See README.md.
"""

from .metadata import WeightsMetadata, read_metadata
from .registry import CHECKPOINTS, Checkpoint, WeightsUnavailableError, download, resolve_weights

__all__ = ["CHECKPOINTS", "Checkpoint", "WeightsMetadata", "WeightsUnavailableError", "download",
           "read_metadata", "resolve_weights"]
