"""How MLX's CUDA backend launches kernels: the settings candle_nn picks for inference.

MLX (0.32) records every op of an evaluation into CUDA graphs of at most 30 ops on an H100,
capturing each cuDNN/cuBLAS call into a child graph and instantiating (or updating) the graph at
every commit. For convolutional inference that host work is the bottleneck on an H100: measured
with benchmarks/bench_gpu_trace.py, ResNet-50 float16 under ``mx.compile`` spent 3.3 ms of host time
per batch-1 forward for 0.44 ms of GPU kernels (and 3.9 ms for 1.75 ms at batch 32), most of it
in ``cudaGraphInstantiate``/``cudaGraphExecDestroy``. Launching directly (``MLX_USE_CUDA_GRAPHS=0``)
removes that work; see README, "Benchmarks".

``import candle_nn`` applies :data:`DEFAULTS` with ``os.environ.setdefault`` before MLX
initialises CUDA, so a variable the user set wins; ``CANDLE_NN_CUDA_LAUNCH=mlx`` keeps MLX's own
defaults. Nothing here changes results, and nothing applies to the CPU or Metal.
"""

from __future__ import annotations

import os

from . import config

ENV_VAR = "CANDLE_NN_CUDA_LAUNCH"
DEFAULTS: dict[str, str] = {"MLX_USE_CUDA_GRAPHS": "0"}


def configure_from_env() -> None:
    """Apply :data:`DEFAULTS` unless ``CANDLE_NN_CUDA_LAUNCH=mlx``. Called by
    ``import candle_nn``."""
    wanted = config.get(ENV_VAR).lower()
    if wanted not in ("candle", "mlx"):
        raise ValueError(f"{ENV_VAR}={wanted!r}: expected 'candle' or 'mlx'")
    if wanted == "candle":
        for key, value in DEFAULTS.items():
            os.environ.setdefault(key, value)
