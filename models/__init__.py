"""Model definitions built on candle_nn (ResNet, YOLOv8, MobileSAM/SAM)."""

# First, before anything imports MLX: candle_nn picks the fast CPU BLAS (candle_nn/blas.py).
import candle_nn  # noqa: F401
