"""candle_nn's version (pyproject.toml's)."""

__version__ = "0.1.0"
