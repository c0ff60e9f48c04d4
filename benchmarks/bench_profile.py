"""``python -m benchmarks --profile``: where a candle_nn model's forward spends its time.

Every :class:`candle_nn.Module` call's inputs and output are evaluated (``mx.eval``) and the call
timed, so MLX's lazy graph is cut at module boundaries and functional ops (attention, GELU,
residual adds) count in the module that calls them: the total is a little above the un-profiled
forward (no overlap, no fusion across modules) but the split between layers is honest. Times are
*self* times (children excluded), summed per layer type (the module class; convolutions split by
kernel, stride and grouping, since each shape takes a different path) and per individual module.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Any, Iterator

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
        # The inputs are the caller's lazy work (e.g. the attention before an output projection,
        # the GELU before a conv): evaluated here, in the caller's time, not this module's.
        mx.eval([a for a in (*args, *kwargs.values()) if isinstance(a, mx.array)])
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
        key = (layer_type(self), names.get(id(self), type(self).__name__))
        records.setdefault(key, []).append(total - children)
        return out

    cn.Module.__call__ = call
    try:
        yield
    finally:
        cn.Module.__call__ = original


def layer_type(module: Any) -> str:
    """The module class, with a convolution's kernel/stride/grouping: ``"Conv2d 3x3/s1"``,
    ``"Conv2d 3x3/s2 depthwise"``, ``"Conv2d 1x1/s1"``, ``"ConvTranspose2d 2x2/s2"``."""
    name = type(module).__name__
    config, weight = getattr(module, "config", None), getattr(module, "weight", None)
    if config is None or weight is None or getattr(weight, "ndim", 0) != 4 \
            or not hasattr(config, "stride"):
        return name
    _, kh, kw, cin = weight.shape
    stride = config.stride if isinstance(config.stride, int) else "x".join(map(str, config.stride))
    groups = getattr(config, "groups", 1)
    kind = " depthwise" if groups > 1 and cin == 1 else f" groups={groups}" if groups > 1 else ""
    return f"{name} {kh}x{kw}/s{stride}{kind}"


def profile(model: BenchModel, forward: Any, inputs: tuple, runs: int = 3) -> str:
    """Self time per module class and the ten costliest modules, as text."""
    import mlx.core as mx

    names: dict[int, str] = {}
    if hasattr(forward, "named_modules"):
        names = {id(m): path or type(m).__name__ for path, m in forward.named_modules()}
    def fn() -> None:
        mx.eval(forward(*inputs))

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
             f"  {'layer type':28s} {'ms':>8s} {'share':>6s} {'calls':>6s}"]
    for cls, secs in sorted(per_class.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {cls:28s} {1e3 * secs:8.2f} {secs / total:6.1%} {calls[cls]:6d}")
    lines.append("  costliest modules:")
    top = sorted(records.items(), key=lambda kv: -sum(kv[1]))[:10]
    for (cls, path), times in top:
        lines.append(f"    {path:40s} {cls:28s} {1e3 * sum(times) / runs:8.2f} ms")
    return "\n".join(lines)
