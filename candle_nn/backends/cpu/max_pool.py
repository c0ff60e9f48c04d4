"""Max pooling by the compiled kernel (csrc/max_pool.cpp) for inference on the CPU.

MLX limitation: ``nn.MaxPool2d`` pads the input with -inf (a copy), then reduces an
``as_strided`` window view on one thread: 1.3 ms for ResNet's 112x112x64 3x3/s2 stem pool and
0.4 ms for each of YOLOv8n's 20x20x128 5x5 SPPF pools at 640, against ~0.2 ms in ONNX Runtime.
Here each output pixel is the maximum of its taps inside the image, kept in registers (NaN
kept, as MLX's max), output rows over the thread pool: the same values, bit for bit. Traced
calls (``mx.grad``) take the reference, whose VJP is PyTorch's (ops/pooling.py).
"""

from __future__ import annotations

from ...ops.registry import register
from . import kernels


def applies(x, kernel, stride, padding) -> bool:
    """A float32 NHWC CPU input, padding at most half the kernel (as PyTorch requires)."""
    return (x.ndim == 4 and kernels.float32_cpu(x.dtype)
            and all(0 <= 2 * p <= k for p, k in zip(padding, kernel)))


@register("max_pool2d", "max_pool", "cpu", applies=applies, available=kernels.loaded,
          works_around="MLX's max pool pads by a copy and reduces a strided view on one thread")
def max_pool2d(x, kernel, stride, padding):
    kernels.sync_threads()
    return kernels.module().max_pool2d(x, tuple(kernel), tuple(stride), tuple(padding))
