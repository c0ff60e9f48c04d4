"""Command-line programs (installed as ``candle_nn_models.scripts``): one per model and their
shared helpers. The benchmark harness lives outside the package, in the repository's benchmarks/.

Deliberately imports nothing (see ``candle_nn_models/__init__.py``).
"""
