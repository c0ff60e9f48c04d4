"""CPU-only fast paths: where MLX 0.32's CPU backend is slow, the same math in a faster form.

Every path here is taken only when the op runs on the CPU (``mx.default_device() == mx.cpu``,
as inside ``with Device.on_device()`` of a CPU model), so GPU results never change. One switch
turns them all off: ``CANDLE_NN_CPU_FAST=0`` in the environment (read at import) or
:func:`set_enabled`. Each one works around one MLX limitation:

==========================  ======================================================================
path                        MLX CPU limitation it works around
==========================  ======================================================================
:func:`depthwise_conv2d`    grouped convs run a naive scalar loop (2.5-4x slower than
                            ``kH * kW`` shifted multiply-adds fused by ``mx.compile``)
:func:`silu_f32`            ``exp``/``sigmoid`` are scalar libm calls (~15-25 ns/element); a
                            polynomial exp fused by ``mx.compile`` is ~4x faster, 2.2 ulp
``cpu_fast_gelu.gelu_f32``  ``erf`` is a scalar call (MobileSAM's encoder: GELU was about half
                            the CPU time); erf from multiply-adds only, see cpu_fast_gelu.py
==========================  ======================================================================

``mx.compile`` on the CPU fuses short chains only and stops at float/int bit casts (``view``):
a polynomial exp-based exact GELU tried here ran as ~30 kernels and was ~2x slower than
``mx.erf``, which is why cpu_fast_gelu.py avoids ``exp`` and bit casts.

Without a C++ compiler MLX runs compiled functions unfused: still right, just slower.
Parity of each path with the plain MLX op (and float64) is tested in tests/test_cpu_fast.py and
tests/test_cpu_fast_gelu.py.
"""

from __future__ import annotations

import functools
import os

import mlx.core as mx

ENV_VAR = "CANDLE_NN_CPU_FAST"
_enabled = os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "off", "false", "no")


def enabled() -> bool:
    """Whether the CPU fast paths are on (they are by default)."""
    return _enabled


def set_enabled(flag: bool) -> None:
    """Turn every CPU fast path on or off (plain MLX ops when off); for A/B checks and tests."""
    global _enabled
    _enabled = bool(flag)


def applies(dtype: mx.Dtype | None = None) -> bool:
    """True when a fast path should run: switched on, the CPU is the current device, and (when
    given) ``dtype`` is float32 (the polynomial paths are tuned for float32)."""
    return _enabled and mx.default_device() == mx.cpu and (dtype is None or dtype == mx.float32)


# -- depthwise conv --------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def depthwise_conv2d(kh: int, kw: int, stride: tuple[int, int], padding: tuple[int, int]):
    """A depthwise conv (one filter per channel) as ``kH * kW`` shifted multiply-adds, fused by
    ``mx.compile``. Returns ``f(x (N, H, W, C), weight (C, kH, kW, 1)) -> (N, H', W', C)``."""
    (sh, sw), (ph, pw) = stride, padding

    def depthwise(x: mx.array, weight: mx.array) -> mx.array:
        n, h, w, c = x.shape
        oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        xp = mx.pad(x, [(0, 0), (ph, ph), (pw, pw), (0, 0)]) if ph or pw else x
        y = None
        for i in range(kh):
            for j in range(kw):
                tap = xp[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :]
                y = tap * weight[:, i, j, 0] if y is None else y + tap * weight[:, i, j, 0]
        return y

    return mx.compile(depthwise)


# -- exp, SiLU, GELU -------------------------------------------------------------------------------
def exp_f32(x: mx.array) -> mx.array:
    """float32 ``exp`` as Cephes' ``expf``: Cody-Waite reduction by ln 2, a degree-6 polynomial,
    and 2**n built in the exponent bits; within 2.2 ulp (MLX's ``x * sigmoid(x)``: 24 ulp)."""
    x = mx.clip(x, -87.3, 88.3)
    n = mx.floor(x * 1.4426950408889634 + 0.5)
    r = x - n * 0.693359375 + n * 2.12194440e-4
    p = r * 1.9875691500e-4 + 1.3981999507e-3
    for c in (8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + c
    two_n = ((n.astype(mx.int32) + 127) << 23).view(mx.float32)
    return (p * (r * r) + r + 1.0) * two_n


# ``x * sigmoid(x)`` for float32 on the CPU (see exp_f32).
silu_f32 = mx.compile(lambda x: x / (1.0 + exp_f32(-x)))
