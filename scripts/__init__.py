"""Command-line programs (installed as ``candle_nn_models.scripts``): one per model and their
shared helpers. The benchmark harness lives outside the package, in the repository's benchmarks/.

Deliberately imports nothing; each CLI module imports candle_nn before MLX itself.
"""
