"""``candle-nn-bench``, this repository's benchmark harness (not part of the installed package).

Run it from the repository root, in a venv with the package installed (``pip install -e .``, plus
``'.[bench]'`` for the PyTorch / ONNX Runtime peers)::

    python -m benchmarks --quick

Deliberately imports nothing: the PyTorch/ONNX Runtime worker processes (``python -m benchmarks
--worker``) must not load candle_nn (and its preloaded BLAS).
"""
