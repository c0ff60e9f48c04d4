"""The GPU trace of a few calls: kernel time vs idle gaps vs host time, and the top kernels, from
a CUPTI trace recorded through ``torch.profiler`` (Kineto). bench_timing.py records it with a
benchmark row (``--trace``); bench_gpu_trace.py is the stand-alone tool and says more.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
import time
from collections import defaultdict
from typing import Any, Callable

_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _category(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("conv", "xmma_fprop", "implicit", "fprop", "cudnn", "dgrad",
                            "winograd", "depthwise", "sm90_xmma", "cutlass", "nchw", "nhwc")):
        return "conv/cudnn"
    if any(k in n for k in ("gemm", "gemv", "matmul", "cublas", "sm90_", "ampere_", "wgmma")):
        return "gemm"
    if any(k in n for k in ("reduce", "softmax", "layer_norm", "layernorm", "rms", "mean")):
        return "reduce/norm"
    if any(k in n for k in ("copy", "transpose", "memcpy", "memset", "concat", "pad", "gather",
                            "scatter", "slice")):
        return "copy/layout"
    if "triton" in n:
        return "triton (fused)"
    return "elementwise/other"


def analyse(trace_path: str, iters: int, top: int = 8) -> dict:
    """Per-forward GPU statistics from a Kineto chrome trace covering ``iters`` forwards."""
    with open(trace_path) as f:
        events = json.load(f).get("traceEvents", [])
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in _GPU_CATS]
    runtime = [e for e in events if e.get("ph") == "X"
               and e.get("cat") in ("cuda_runtime", "cuda_driver")]
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in gpu)
    busy, end = 0.0, None
    start = None
    for s, t in spans:
        if end is None or s > end:
            if end is not None:
                busy += end - start
            start, end = s, t
        else:
            end = max(end, t)
    if end is not None:
        busy += end - start
    per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    per_cat: dict[str, float] = defaultdict(float)
    for e in gpu:
        name = e.get("name", "?")
        per_name[name][0] += float(e.get("dur", 0))
        per_name[name][1] += 1
        category = _category(name) if e["cat"] == "kernel" else "copy/layout"
        per_cat[category] += float(e.get("dur", 0))
    total = sum(v[0] for v in per_name.values()) or 1.0
    api: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in runtime:
        api[e.get("name", "?")][0] += float(e.get("dur", 0))
        api[e.get("name", "?")][1] += 1
    return {
        "kernels": sum(1 for e in gpu if e["cat"] == "kernel") / iters,
        "kernel_sum_ms": total / iters / 1e3,
        "busy_ms": busy / iters / 1e3,
        "categories": {k: round(v / total, 3)
                       for k, v in sorted(per_cat.items(), key=lambda kv: -kv[1])},
        "top": [{"name": _short(k), "ms": round(v[0] / iters / 1e3, 4),
                 "share": round(v[0] / total, 3), "calls": v[1] / iters}
                for k, v in sorted(per_name.items(), key=lambda kv: -kv[1][0])[:top]],
        "api": [{"name": k, "ms": round(v[0] / iters / 1e3, 4), "calls": v[1] / iters}
                for k, v in sorted(api.items(), key=lambda kv: -kv[1][0])[:5]],
    }


def _short(name: str) -> str:
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= 110 else name[:107] + "..."


def profiled(run: Callable[[], Any], iters: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                run()
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        prof.export_chrome_trace(path)
        return analyse(path, iters)


Enqueue = Callable[[], Callable[[], Any]]


def host_ms(enqueue: Enqueue, iters: int = 10) -> float:
    """Median host time of one forward, ms: ``enqueue()`` builds and launches the forward without
    waiting for the GPU and returns a function that waits for it (called after the clock stops)."""
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        wait = enqueue()
        samples.append(time.perf_counter() - start)
        wait()
    return median_ms(samples)


def profile_calls(single: Callable[[], Any], batched: Callable[[], Any], iters: int = 10,
                  enqueue: tuple[Enqueue, Enqueue] | None = None) -> dict:
    """``{"bs1": stats, "batch": stats}`` (see :func:`analyse`) for two synchronous callables,
    with ``host_ms`` (see :func:`host_ms`) when their ``enqueue`` counterparts are given;
    ``candle-nn-bench`` records these in its JSON when ``--trace``."""
    # Host times first: measured after a CUPTI trace in the same process, they came out above the
    # untraced wall time on the H100 (PyTorch eager, MobileSAM encoder float16: 14.3 vs 7.3 ms).
    hosts = [host_ms(fn, max(iters, 10)) for fn in enqueue] if enqueue is not None else [None] * 2
    out: dict[str, dict] = {}
    for host, (key, call, n) in zip(hosts, (("bs1", single, iters),
                                            ("batch", batched, max(3, iters // 2)))):
        try:
            out[key] = profiled(call, n)
        except Exception as exc:  # the timings stand without a trace
            out[key] = {"trace_error": f"{type(exc).__name__}: {exc}"[:300]}
        if host is not None:
            out[key]["host_ms"] = host
    return out


def median_ms(samples: list[float]) -> float:
    return round(1e3 * statistics.median(samples), 4)
