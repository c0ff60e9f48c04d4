"""Timing primitives shared by every implementation ``candle-nn-bench`` measures.

One protocol for all: a first call (cold: compilation, allocation, lazy weight reads), then
``warmup`` calls, then up to ``repeat`` timed calls at batch 1 (stopping early, after at least
three, once ``budget_s`` has passed), then the same at the throughput batch. Every timed call
ends with a synchronisation (``mx.eval``, ``torch.cuda.synchronize``, ONNX Runtime's blocking run).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from benchmarks.bench_models import BenchModel


@dataclass(frozen=True)
class Options:
    """Measurement settings (``--quick`` shrinks them)."""

    warmup: int = 3
    repeat: int = 20
    budget_s: float = 15.0
    batch: int | None = None  # throughput batch; None: the model's CPU batch, or 32 on a GPU
    threads: int | None = None
    precision: str = "exact"  # float32 on GPUs: "exact" or "tf32", for ours and the peers alike
    channels_last: bool = True  # PyTorch on GPUs
    seed: int = 0
    amg_points: int = 32  # mobilesam-amg: grid points per side (MobileSAM's default)
    trace: bool = False  # also record the GPU kernel/idle trace (bench_gpu_trace.py)
    quick_train: bool = False  # training rows at batch 2 (or --batch), 64x64 (bench_train.py)

    @classmethod
    def quick(cls, **kw: Any) -> "Options":
        given = {k: v for k, v in kw.items() if v is not None}
        return cls(**{"warmup": 1, "repeat": 3, "budget_s": 2.0, "batch": 2, "quick_train": True,
                      **given})

    def batch_for(self, model: BenchModel, device: str) -> int:
        if self.batch is not None:
            return self.batch
        return model.batch if device == "cpu" else (8 if model.input_hw[0] >= 1024 else 32)

    def as_dict(self) -> dict:
        return asdict(self)


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def time_calls(single: Callable[[], Any], batched: Callable[[], Any], batch: int,
               opts: Options, enqueue: tuple[Callable, Callable] | None = None) -> dict:
    """First-call, steady batch-1 and throughput figures for two synchronous callables
    (``batched`` runs a batch of ``batch``). ``enqueue``: the same two forwards launched without
    waiting, each returning its wait (the GPU trace's host time; see bench_gpu_trace.host_ms)."""
    start = time.perf_counter()
    single()
    first_s = time.perf_counter() - start
    for _ in range(opts.warmup):
        single()
    times = _timed(single, opts)
    batched()  # its own first call (new shapes) is not timed
    batch_times = _timed(batched, opts)
    batch_s = statistics.median(batch_times)
    trace = {}
    # GPU kernel/idle split (benchmarks/gpu_trace.py)
    if opts.trace:
        from benchmarks.gpu_trace import profile_calls

        trace = {"trace": profile_calls(single, batched, enqueue=enqueue)}
    return {
        "first_s": first_s,
        "median_ms": 1e3 * statistics.median(times),
        "p90_ms": 1e3 * _percentile(times, 90),
        "runs": len(times),
        "batch": batch,
        "batch_median_ms": 1e3 * batch_s,
        "throughput_ips": batch / batch_s,
        **trace,
    }


def time_pipeline(call: Callable[[], Any], opts: Options) -> dict:
    """The figures of :func:`time_calls` for a whole pipeline (one call = one image, seconds or
    more), batch 1 only, no separate warm-up: every call is timed, the first (cold) one is
    ``first_s``, and with ``repeat`` ≥ 2 the median is over the calls after it (at least one,
    whatever the budget). The cold call is no noise on a GPU: on the H100 it was 29 s of MLX's
    CUDA kernel compilation against 0.5 s per later call. With ``repeat`` 1 (a CPU run of minutes
    per call) the one call is the median."""
    times = _timed(call, opts, min_calls=min(2, max(opts.repeat, 1)))
    warm = times[1:] or times
    median_s = statistics.median(warm)
    return {"first_s": times[0], "median_ms": 1e3 * median_s,
            "p90_ms": 1e3 * _percentile(warm, 90), "runs": len(warm), "batch": 1,
            "batch_median_ms": 1e3 * median_s, "throughput_ips": 1 / median_s}


def _timed(call: Callable[[], Any], opts: Options, min_calls: int = 3) -> list[float]:
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max(opts.repeat, 1):
        if len(times) >= min_calls and time.perf_counter() - start > opts.budget_s:
            break
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return times


def result(impl: str, model: BenchModel, device: str, dtype: str, *, status: str = "ok",
           reason: str | None = None, load_s: float | None = None, version: str | None = None,
           note: str | None = None, **timings: Any) -> dict:
    """One row of the benchmark: an implementation of a model on a device in a dtype."""
    return {"model": model.name, "input_hw": list(model.input_hw), "device": device,
            "dtype": dtype, "impl": impl, "status": status, "reason": reason,
            "version": version, "load_s": load_s, "note": note, **timings}
