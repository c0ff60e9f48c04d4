"""The non-finite output check every model run makes: inputs are finite, so NaN or infinity in a
model's output means its weights are at fault."""

from __future__ import annotations

import os

import numpy as np

from candle_nn import CandleNNError

from candle_nn_models.image_file import shown


def check_finite(values: np.ndarray, weights: "str | os.PathLike") -> None:
    """Refuse model outputs with NaN or infinity: inputs are finite, so the weights are at fault."""
    if not np.isfinite(values).all():
        raise CandleNNError(f"the model produced non-finite outputs (NaN or infinity): the weights "
                            f"in {shown(weights)} are corrupt (e.g. NaN values) or overflow their "
                            "dtype; check the file or convert it again")
