"""What ``import candle_nn`` does before anything imports MLX: the import-time policy, in one place.

Three settings that MLX reads once, when it loads or first initialises a backend, so they must be
in place before ``mlx.core`` is imported:

1. float32 means float32 on CUDA too: ``MLX_ENABLE_TF32=0`` unless the user opted in
   (``precision.py``; ``CANDLE_NN_PRECISION=tf32``),
2. CUDA kernels launched the way that is fastest for inference: ``MLX_USE_CUDA_GRAPHS=0``
   (``cuda_launch.py``; ``CANDLE_NN_CUDA_LAUNCH=mlx`` keeps MLX's defaults),
3. an optimized CPU BLAS bound to MLX alone on Linux, in place of the reference BLAS MLX's wheel
   bundles (``blas.py``; ``CANDLE_NN_BLAS=off`` opts out).

And one that only applies to later allocations but belongs with them: glibc's malloc keeps large
freed blocks for reuse (``cpu_malloc.py``; ``CANDLE_NN_CPU_MALLOC=os`` opts out).

``candle_nn/__init__.py`` imports this module first, so importing anything from candle_nn applies
the policy. The one rule for code that uses both: **import candle_nn before mlx**. Library users
write ``import candle_nn`` first (a late one warns: the BLAS cannot be bound once MLX has loaded);
in this repository every module lists candle_nn with the other libraries it imports, in
alphabetical order, so ``candle_nn`` comes before ``mlx`` and nothing more is needed.
``tests/test_import_order.py`` imports each module of ``candle_nn_models`` and ``benchmarks`` first
in a fresh interpreter and checks that MLX got the fast BLAS. (``candle_nn_models/__init__.py`` and
its ``scripts/__init__.py`` import nothing: the CLIs' launcher installs its Ctrl-C handling before
candle_nn, NumPy and MLX load.)

``candle_nn.info()`` (``python -m candle_nn``) reports what the policy chose.
"""

from __future__ import annotations

from . import blas, cpu_malloc, cuda_launch, precision

precision.configure_from_env()
cpu_malloc.configure()
cuda_launch.configure_from_env()
blas.preload()
