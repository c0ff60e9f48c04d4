"""Checkpoints for candle_nn's models: the registered models and their variants (:data:`SPECS`,
:func:`build_model`, from the models' own config tables), the registry of candle's published
files (:func:`resolve_weights`), the ``candle_nn.*`` safetensors metadata of converted files
(:func:`read_metadata`), and the ``candle-nn-weights`` tool (:mod:`weights.cli`). See README.md.
"""

from .metadata import WeightsMetadata, read_metadata
from .registry import CHECKPOINTS, Checkpoint, WeightsUnavailableError, download, resolve_weights
from .spec import SPECS, ModelSpec, build_model, expected_tensors

__all__ = ["CHECKPOINTS", "SPECS", "Checkpoint", "ModelSpec", "WeightsMetadata",
           "WeightsUnavailableError", "build_model", "download", "expected_tensors",
           "read_metadata", "resolve_weights"]
