"""Float32 precision policy.

MLX's CUDA backend runs float32 matmuls and convolutions in TF32 (10-bit mantissa) unless the
environment variable ``MLX_ENABLE_TF32=0`` is set before MLX initialises its CUDA backend. On an
H100 that turns a ResNet-18's logits from 4e-7 into 3.8e-4 relative error. candle_nn therefore
defaults to **exact** float32: importing :mod:`candle_nn` sets ``MLX_ENABLE_TF32=0`` unless the
user opted in.

Opt in to TF32 (faster on NVIDIA GPUs, ~1e-3 relative error) with ``CANDLE_NN_PRECISION=tf32`` in
the environment, or by calling :func:`set_float32_precision("tf32")` before the first GPU op.
An explicit ``MLX_ENABLE_TF32`` set by the user is respected as is. Metal and the CPU are always
exact; float16/bfloat16 models are unaffected.
"""

from __future__ import annotations

import os
from typing import Literal

from . import config

Precision = Literal["exact", "tf32"]
ENV_VAR = "CANDLE_NN_PRECISION"
MLX_ENV_VAR = "MLX_ENABLE_TF32"


def configure_from_env() -> None:
    """Apply the policy to the environment. Called by ``import candle_nn`` before MLX loads."""
    wanted = config.get(ENV_VAR).lower()
    if wanted not in ("exact", "tf32"):
        raise ValueError(f"{ENV_VAR}={wanted!r}: expected 'exact' or 'tf32'")
    os.environ.setdefault(MLX_ENV_VAR, "1" if wanted == "tf32" else "0")


def set_float32_precision(precision: Precision) -> None:
    """Choose ``"exact"`` float32 or ``"tf32"`` for GPU matmuls/convs.

    Takes effect only if called before MLX's CUDA backend runs its first matmul/conv in this
    process (MLX reads the setting once); set ``CANDLE_NN_PRECISION`` to be sure.
    """
    if precision not in ("exact", "tf32"):
        raise ValueError(f"precision must be 'exact' or 'tf32', not {precision!r}")
    os.environ[MLX_ENV_VAR] = "1" if precision == "tf32" else "0"


def float32_precision() -> Precision:
    """The float32 precision in force for GPU matmuls/convs: ``"exact"`` or ``"tf32"``."""
    return "tf32" if os.environ.get(MLX_ENV_VAR, "1") not in ("0", "false", "False") else "exact"
