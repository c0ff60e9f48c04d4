"""One cache for the forms the CPU kernels derive from a weight (the packed GEMM's packing,
Winograd's transformed weights): computed on first use, kept while the weight array lives.

Keyed by the weight array's identity: a weight replaced in place by ``weight[...] = v`` is not
noticed (assign a new array instead).
"""

from __future__ import annotations

import weakref
from typing import Callable

import mlx.core as mx

# (kind, id(weight)) -> (weak reference to the weight, its derived form)
_cache: dict[tuple[str, int], tuple[weakref.ref, mx.array]] = {}


def derived(kind: str, weight: mx.array,
            make: Callable[[mx.array], mx.array | None]) -> mx.array | None:
    """``make(weight)`` computed once per weight array and ``kind``; ``None`` (not cached) when
    ``make`` gives ``None``."""
    key = (kind, id(weight))
    hit = _cache.get(key)
    if hit is not None and hit[0]() is weight:
        return hit[1]
    value = make(weight)
    if value is None:
        return None

    def forget(ref: weakref.ref, key: tuple[str, int] = key) -> None:
        if _cache.get(key, (None,))[0] is ref:
            del _cache[key]

    _cache[key] = (weakref.ref(weight, forget), value)
    return value


def size(kind: str | None = None) -> int:
    """How many derived weights are cached (of ``kind``, when given)."""
    return sum(1 for k in _cache if kind is None or k[0] == kind)
