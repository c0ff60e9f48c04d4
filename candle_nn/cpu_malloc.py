"""Large CPU arrays without a page fault per 4 KiB: glibc's malloc told to reuse freed memory.

MLX allocates every CPU array with ``malloc`` and frees it with ``free``; it keeps no buffer cache
on the CPU (``mx.get_cache_memory()`` stays 0). glibc serves a request above its mmap threshold
(dynamic, at most 32 MiB) with a fresh ``mmap`` and returns it with ``munmap`` on ``free``, so a
forward pass whose intermediates are that large (TinyViT's first stage: ``(1, 256, 256, 256)``
float32, 64 MiB) maps, faults in page by page (the kernel zeroes each one) and unmaps every
intermediate on every call: a one-pass element-wise op over such an array took 67 ms instead of
12 ms on a 2-core EPYC, most of it in the kernel. (ONNX Runtime and PyTorch keep arenas.)

:func:`configure` (run by ``import candle_nn`` on Linux with glibc) raises glibc's mmap threshold
and trim threshold to :data:`THRESHOLD` with ``mallopt``, so such blocks come from the heap and
stay mapped after ``free`` for the next call to reuse. The cost: the process keeps up to
:data:`THRESHOLD` of freed memory mapped (its resident size stays near its peak instead of
shrinking between calls). The setting is process-wide (NumPy's and PyTorch's ``malloc`` calls get
it too) and takes effect for later allocations. ``CANDLE_NN_CPU_MALLOC=os`` keeps glibc's
defaults. ``candle_nn.info()`` reports what was done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys
from dataclasses import dataclass

from . import config

THRESHOLD = 1 << 30  # bytes: requests below come from the heap; this much freed memory is kept
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h> mallopt parameters


@dataclass(frozen=True)
class MallocStatus:
    """``state``: ``"reuse"`` (thresholds raised), ``"os"`` (glibc's defaults kept, by request),
    or ``"unavailable"`` (not glibc, or mallopt refused); ``detail`` says which and why."""

    state: str
    detail: str

    def as_dict(self) -> dict:
        return {"state": self.state, "detail": self.detail}


_status = MallocStatus("unavailable", "not configured")


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def configure() -> MallocStatus:
    """Apply ``CANDLE_NN_CPU_MALLOC`` (``reuse``, the default, or ``os``) once; the status."""
    global _status
    if _status.detail != "not configured":
        return _status
    if config.get("CANDLE_NN_CPU_MALLOC").lower() in ("os", "off", "0"):
        _status = MallocStatus("os", "glibc's malloc defaults (CANDLE_NN_CPU_MALLOC=os)")
        return _status
    libc = _glibc()
    if libc is None:
        _status = MallocStatus("unavailable", "not Linux with glibc: the system's malloc as is")
        return _status
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, THRESHOLD) != 1 or mallopt(_M_TRIM_THRESHOLD, THRESHOLD) != 1:
        _status = MallocStatus("unavailable", "glibc refused mallopt: its defaults kept")
        return _status
    _status = MallocStatus("reuse", f"glibc keeps freed blocks below {THRESHOLD >> 20} MiB "
                                    "mapped for reuse (CANDLE_NN_CPU_MALLOC=os: its defaults)")
    return _status


def status() -> MallocStatus:
    """What :func:`configure` did."""
    return _status
