"""Command-line programs: one per model, the benchmark, and their shared helpers.

Deliberately imports nothing: the benchmark's PyTorch/ONNX Runtime worker processes must not load
candle_nn (and its preloaded BLAS). Each CLI module imports candle_nn before MLX itself.
"""
