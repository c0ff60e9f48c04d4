"""``python -m benchmarks --profile``: where a candle_nn model's forward spends its time.

Every :class:`candle_nn.Module` call is evaluated (``mx.eval``) and timed, so MLX's lazy graph
is cut at module boundaries: the total is a little above the un-profiled forward (no overlap, no
fusion across modules) but the split between layers is honest. Times are *self* times (children
excluded), summed per module class and per individual module.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Any, Callable, Iterator

from benchmarks.bench_models import BenchModel


@contextlib.contextmanager
def _timed_modules(records: dict[tuple[str, str], list[float]],
                   names: dict[int, str]) -> Iterator[None]:
    """Time every candle_nn Module call into ``records[(class, path)]`` while active."""
    import mlx.core as mx

    import candle_nn as cn

    original = cn.Module.__call__
    stack: list[float] = []  # children's time accumulated per open call

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        stack.append(0.0)
        start = time.perf_counter()
        try:
            out = original(self, *args, **kwargs)
            mx.eval(out)
        finally:
            total = time.perf_counter() - start
            children = stack.pop()
            if stack:
                stack[-1] += total
        key = (type(self).__name__, names.get(id(self), type(self).__name__))
        records.setdefault(key, []).append(total - children)
        return out

    cn.Module.__call__ = call
    try:
        yield
    finally:
        cn.Module.__call__ = original


def profile(model: BenchModel, forward: Any, inputs: tuple, runs: int = 3) -> str:
    """Self time per module class and the ten costliest modules, as text."""
    import mlx.core as mx

    names: dict[int, str] = {}
    if hasattr(forward, "named_modules"):
        names = {id(m): path or type(m).__name__ for path, m in forward.named_modules()}
    fn: Callable[[], None] = lambda: mx.eval(forward(*inputs))  # noqa: E731
    fn()
    fn()
    plain = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        plain.append(time.perf_counter() - start)
    plain_ms = 1e3 * sorted(plain)[len(plain) // 2]
    records: dict[tuple[str, str], list[float]] = {}
    with _timed_modules(records, names):
        fn()
        records.clear()
        for _ in range(runs):
            fn()
    per_class: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for (cls, _), times in records.items():
        per_class[cls] += sum(times) / runs
        calls[cls] += len(times) // runs
    total = sum(per_class.values())
    lines = [f"{model.name}: forward {plain_ms:.1f} ms un-profiled (median), {1e3 * total:.1f} ms "
             "with an eval after every module (self times below)",
             f"  {'module class':28s} {'ms':>8s} {'share':>6s} {'calls':>6s}"]
    for cls, secs in sorted(per_class.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {cls:28s} {1e3 * secs:8.2f} {secs / total:6.1%} {calls[cls]:6d}")
    lines.append("  costliest modules:")
    top = sorted(records.items(), key=lambda kv: -sum(kv[1]))[:10]
    for (cls, path), times in top:
        lines.append(f"    {path:40s} {cls:20s} {1e3 * sum(times) / runs:8.2f} ms")
    return "\n".join(lines)
