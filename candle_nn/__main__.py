"""``python -m candle_nn``: print :func:`candle_nn.info` (MLX, devices, CPU BLAS, precision)."""

import candle_nn

print(candle_nn.info())
