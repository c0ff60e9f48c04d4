"""Exact-erf GELU for float32 on the CPU as two polynomials fused by ``mx.compile``.

MLX 0.32's CPU ``erf`` is a scalar call per element (~8x the cost of a multiply), and GELU
costs five passes over the tensor; in MobileSAM's TinyViT encoder GELU was over half the CPU
time. Here ``erf`` is built from multiply-adds and selects only (no ``exp``, no bit casts, which
``mx.compile`` cannot fuse on the CPU), so GELU compiles to two fused loops (see below):

- ``|z| < 1``: ``erf(z) = z * P(z²)``, ``P`` of degree 6 (least squares on Chebyshev nodes,
  1.6e-9 relative in float64);
- ``1 <= |z| < 4``: ``erfc(|z|) = Q(t)``, ``t = (2|z| - 5) / 3``, ``Q`` of degree 12 (4.8e-8
  absolute in float64, and ``erf >= 0.84`` there); ``erfc(4) < 1.6e-8``, so ``|z|`` is clipped
  to 4.

In float32 ``erf`` stays within 1e-6 relative of float64's exact ``erf`` everywhere (tested in
tests/candle_nn/backends/test_cpu_fast_gelu.py; measured 1.8e-7), and
GELU's result is within ``0.5e-6 |x|`` of the exact one.

Registered as the ``gelu_poly`` implementation of ``gelu``: float32 on the CPU device where the
compiled kernels are not loaded or switched off (GPU results never change). Under ``mx.grad``
the reference runs.
"""

from __future__ import annotations

import math

import mlx.core as mx

from ...ops.registry import register
from . import kernels

# erf(z) / z as a polynomial in z² on [0, 1].
_SMALL = (1.1283791666e+00, -3.7612629878e-01, 1.1283625725e-01, -2.6855399452e-02,
          5.1912183778e-03, -8.0348466547e-04, 7.9334939046e-05)
# erfc(z) on [1, 4] as a polynomial in t = (2z - 5) / 3.
_LARGE = (4.0692064689e-04, -3.2669689595e-03, 1.2255908110e-02, -2.8195845523e-02,
          4.3602195988e-02, -4.6322068328e-02, 3.2164325984e-02, -9.8107911832e-03,
          -7.4836259593e-03, 1.0797660576e-02, -3.4260997486e-03, -1.8515676006e-03,
          1.1300180487e-03)
_CLIP = 4.0


def _estrin(coeffs: tuple[float, ...], x: mx.array) -> mx.array:
    """``sum(c_k x^k)`` by Estrin's scheme (a graph ~2 log2(n) ops deep instead of Horner's 2n)."""
    terms: list[mx.array | float] = [c0 + c1 * x for c0, c1 in zip(coeffs[::2], coeffs[1::2])]
    if len(coeffs) % 2:
        terms.append(coeffs[-1])
    power = x
    while len(terms) > 1:
        power = power * power
        paired = [lo + hi * power for lo, hi in zip(terms[::2], terms[1::2])]
        terms = paired + ([terms[-1]] if len(terms) % 2 else [])
    return terms[0]


def _erfc_large(x: mx.array, scale: float) -> mx.array:
    """``erfc(a)`` for ``a = |x| * scale >= 1`` (any value below 1): 0 from ``a = 4`` on, so
    GELU(-Inf) is ``-Inf * 0 = NaN`` as in the exact formula."""
    a = mx.minimum(mx.abs(x) * scale, _CLIP)
    return mx.where(a >= _CLIP, 0.0, _estrin(_LARGE, a * (2.0 / 3.0) - 5.0 / 3.0))


def _erf(z: mx.array, erfc_large: mx.array) -> mx.array:
    a = mx.abs(z)
    e = mx.where(a < 1.0, a * _estrin(_SMALL, a * a), 1.0 - erfc_large)
    return mx.where(z < 0, -e, e)


def _gelu_large(x: mx.array) -> mx.array:
    """``1 + erf(x / sqrt 2)`` where ``|x / sqrt 2| >= 1`` (any value elsewhere)."""
    return 1.0 + mx.sign(x) * (1.0 - _erfc_large(x, 1.0 / math.sqrt(2.0)))


def _gelu(x: mx.array, large: mx.array) -> mx.array:
    z = x * (1.0 / math.sqrt(2.0))
    small = 1.0 + z * _estrin(_SMALL, z * z)  # erf is odd: no sign handling needed
    return x * mx.where(x * x < 2.0, small, large) * 0.5


# Two compiled functions, not one: as one compiled function (both polynomials and the select, any
# degree tried) MLX's CPU fusion ran it ~3x slower than this split, no faster than ``mx.erf``;
# split by hand, the two passes are ~3x faster than the plain GELU (16.7M elements). Selects and
# signs are written the way that measured fastest (``sign`` and one ``where``; nested ``where``
# on bool masks was ~3x slower).
# Without a C++ compiler MLX runs compiled functions unfused: still right, just slower.
_erfc_large_unit = mx.compile(lambda z: _erfc_large(z, 1.0))
_erf_combine = mx.compile(_erf)
_gelu_large_compiled = mx.compile(_gelu_large)
_gelu_compiled = mx.compile(_gelu)


def erf_f32(z: mx.array) -> mx.array:
    """``erf(z)`` for float32 ``z``, any shape; within 1e-6 relative of the exact value."""
    return _erf_combine(z, _erfc_large_unit(z))


def gelu_f32(x: mx.array) -> mx.array:
    """Exact GELU ``x * Phi(x)`` for float32 ``x``, any shape (the erf above, in GELU's form)."""
    return _gelu_compiled(x, _gelu_large_compiled(x))


@register("gelu", "gelu_poly", "cpu", applies=lambda x: kernels.float32_cpu(x.dtype),
          works_around="erf is a scalar call on one thread")
def gelu(x):
    return gelu_f32(x)
