"""``python -m benchmarks.bench_cpu_paths``: candle_nn's CPU fast paths A/B, in ONE process.

Each model is loaded once and its batch-1 forward timed round-robin under three settings, so a
busy shared machine slows them alike and the ratios stay meaningful:

- ``plain``: every fast path off (``CANDLE_NN_CPU_FAST=0``: MLX's own ops),
- ``mlx-fast``: the pure-MLX fast paths (polynomial SiLU/GELU, depthwise), the compiled kernels
  off (what a source checkout without ``pip install`` runs),
- ``native-no-conv``: the compiled element-wise kernels (epilogues, GELU, softmax) on, convs
  on MLX's path (the compiled conv's sgemm unset),
- ``native-blas``: every compiled kernel on, convs and Linear layers on the im2col + OpenBLAS
  sgemm conv and MLX's matmul (the packed-weight GEMM off),
- ``native``: every compiled kernel (``candle_nn._cpu_kernels``) on; convs and Linear layers on
  the packed-weight GEMM where the CPU runs it (AVX-512F or AVX2 + FMA), else as
  ``native-blas``.

Example: ``python -m benchmarks.bench_cpu_paths --threads 2 --repeat 5 --models resnet50 yolov8n``
prints each setting's median ms and the ratios native / mlx-fast and native / plain.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import candle_nn as cn  # before mlx: picks the CPU BLAS
import mlx.core as mx
from candle_nn import cpu_fast, cpu_native

from benchmarks.bench import load_ours, ours_inputs
from benchmarks.bench_models import MODELS

SETTINGS = ("plain", "mlx-fast", "native-no-conv", "native-blas", "native")


def _apply(setting: str, kernels: object) -> None:
    cpu_fast.set_enabled(setting != "plain")
    cpu_native._module = kernels if setting.startswith("native") else None
    kernels.set_sgemm(cpu_native._sgemm_address() if setting in ("native", "native-blas") else 0)
    cpu_fast.set_packed_gemm(setting == "native")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["resnet50", "yolov8n", "mobilesam-encoder"],
                   choices=sorted(MODELS))
    p.add_argument("--threads", type=int, default=None, help="BLAS and kernel threads")
    p.add_argument("--repeat", type=int, default=5, help="timed calls per setting")
    args = p.parse_args(argv)
    kernels = cpu_native.module()
    if kernels is None:
        print(f"the compiled kernels are not loaded: {cpu_native.status().detail}")
        return 1
    if args.threads:
        cn.blas.set_num_threads(args.threads)
    print(cn.info())
    cache_dir = tempfile.mkdtemp(prefix="candle_nn-bench-")
    try:
        for name in args.models:
            model = MODELS[name]
            forward, _, _ = load_ours(model, "cpu", "float32", cache_dir)
            inputs = ours_inputs(model, 1, "float32")
            times: dict[str, list[float]] = {s: [] for s in SETTINGS}
            for setting in SETTINGS:  # warm-up: compiles, first-touch allocations
                _apply(setting, kernels)
                mx.eval(forward(*inputs))
            for _ in range(args.repeat):
                for setting in SETTINGS:
                    _apply(setting, kernels)
                    start = time.perf_counter()
                    mx.eval(forward(*inputs))
                    times[setting].append((time.perf_counter() - start) * 1e3)
            ms = {s: statistics.median(t) for s, t in times.items()}
            print(f"{name}: " + ", ".join(f"{s} {ms[s]:.1f} ms" for s in SETTINGS)
                  + f"; native / native-blas {ms['native'] / ms['native-blas']:.2f}, "
                  f"native / mlx-fast {ms['native'] / ms['mlx-fast']:.2f}, "
                  f"native-no-conv / mlx-fast {ms['native-no-conv'] / ms['mlx-fast']:.2f}, "
                  f"native / plain {ms['native'] / ms['plain']:.2f}")
    finally:
        _apply("native", kernels)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
