"""Command-line programs: one per model, the benchmark, and their shared helpers."""

# First, before anything imports MLX: candle_nn picks the fast CPU BLAS (candle_nn/blas.py).
import candle_nn  # noqa: F401
