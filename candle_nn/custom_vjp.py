"""Gradients for custom kernels: MLX's ``mx.fast.cuda_kernel`` / ``metal_kernel`` primitives have
no vector-Jacobian product (``[Primitive::vjp] Not implemented for CustomKernel``), so a model
using one cannot be differentiated. :func:`with_reference_vjp` keeps the kernel for the forward
and takes the VJP of the same math written in MLX ops."""

from __future__ import annotations

from typing import Callable

import mlx.core as mx


def with_reference_vjp(kernel: Callable[..., mx.array],
                       reference: Callable[..., mx.array]) -> Callable[..., mx.array]:
    """``f(*arrays)``: ``kernel(*arrays)``, whose gradient (under ``mx.grad``,
    ``nn.value_and_grad``, ``mx.vjp``, inside ``mx.compile`` too) is ``reference``'s, a function
    of the same arrays computing the same output with MLX ops. Non-array arguments (shapes,
    strides) belong in both functions' closures."""
    f = mx.custom_function(kernel)

    @f.vjp
    def _vjp(primals, cotangent, output):
        primals = [primals] if isinstance(primals, mx.array) else list(primals)  # one input
        _, grads = mx.vjp(reference, primals, [cotangent])
        return tuple(grads) if len(grads) > 1 else grads[0]

    return f
