"""Where a GPU forward's time goes: kernel time vs idle gaps vs host time, and the top kernels.

For candle_nn (eager and ``mx.compile``) and PyTorch (eager channels_last and
``torch.compile(mode="reduce-overhead")``), per model, dtype and batch::

    python -m benchmarks.bench_gpu_trace --side ours --models resnet50 yolov8n mobilesam-encoder \
        --dtypes float32,float16 --batches 1,32 --json trace_ours.json
    python -m benchmarks.bench_gpu_trace --side torch ...   # or --side torch.compile

Kernel activity is recorded by CUPTI through ``torch.profiler`` (Kineto): CUPTI sees every kernel
launched in the process, MLX's too, so both sides are measured by one tool. Per forward it reports

* ``wall``: host clock around one synchronised call (median);
* ``busy``: the union of kernel/memcpy/memset intervals on the GPU; ``idle`` = wall - busy;
* ``host``: for candle_nn the time to build the lazy graph plus ``mx.async_eval`` (encoding and
  launching every kernel), for PyTorch the time until the call returns (launches are async);
* ``kernels``: launches per forward, and the costliest kernels by GPU time.

Run it on the GPU machine (needs torch with CUDA); one side per process.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from typing import Any

from benchmarks.bench_models import MODELS, BenchModel
from benchmarks.gpu_trace import median_ms, profiled


def trace_ours(model: BenchModel, dtype: str, batch: int, compiled: bool, iters: int,
               cache_dir: str) -> dict:
    import candle_nn  # noqa: F401  (the import-time policy, before mlx: candle_nn/_startup.py)
    import mlx.core as mx

    from benchmarks.ours import load_ours, ours_inputs

    forward, _, _ = load_ours(model, "gpu:0", dtype, cache_dir)
    fn = mx.compile(forward) if compiled else forward
    x = ours_inputs(model, batch, dtype)
    for _ in range(5):
        mx.eval(fn(*x))
    walls, builds, submits = [], [], []
    for _ in range(max(iters, 10)):
        t0 = time.perf_counter()
        out = fn(*x)
        t1 = time.perf_counter()
        mx.async_eval(out)
        t2 = time.perf_counter()
        mx.eval(out)
        t3 = time.perf_counter()
        walls.append(t3 - t0)
        builds.append(t1 - t0)
        submits.append(t2 - t1)
    try:
        stats = profiled(lambda: mx.eval(fn(*x)), iters)
    except Exception as exc:  # the timings above still stand
        stats = {"trace_error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"wall_ms": median_ms(walls),
            "host_ms": median_ms([a + b for a, b in zip(builds, submits)]),
            "host_build_ms": median_ms(builds), "host_submit_ms": median_ms(submits), **stats}


def trace_torch(model: BenchModel, dtype: str, batch: int, compiled: bool, iters: int) -> dict:
    import torch

    from benchmarks import bench_peers
    from benchmarks.bench_timing import Options

    opts = Options()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    module = bench_peers._place(model.build_torch(), "gpu:0", dtype, opts)
    fn = torch.compile(module, mode="reduce-overhead") if compiled else module
    x = bench_peers._torch_inputs(model, batch, "gpu:0", dtype, opts)

    def call() -> Any:
        with torch.inference_mode():
            return fn(*x)

    for _ in range(5):
        call()
        torch.cuda.synchronize()
    walls, hosts = [], []
    for _ in range(max(iters, 10)):
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        walls.append(t2 - t0)
        hosts.append(t1 - t0)

    def run() -> None:
        call()
        torch.cuda.synchronize()

    stats = profiled(run, iters)
    return {"wall_ms": median_ms(walls), "host_ms": median_ms(hosts), **stats}


def _line(row: dict) -> str:
    if "error" in row:
        return (f"{row['model']:18s} {row['dtype']:8s} bs{row['batch']:<3d} {row['side']:14s} "
                f"ERROR {row['error']}")
    if "busy_ms" not in row:
        return (f"{row['model']:18s} {row['dtype']:8s} bs{row['batch']:<3d} {row['side']:14s} "
                f"wall {row['wall_ms']:8.3f}  host {row.get('host_ms', float('nan')):7.3f}  "
                f"({row.get('trace_error')})")
    idle = row["wall_ms"] - row["busy_ms"]
    cats = ", ".join(f"{k} {v:.0%}" for k, v in list(row["categories"].items())[:4])
    return (f"{row['model']:18s} {row['dtype']:8s} bs{row['batch']:<3d} {row['side']:14s} "
            f"wall {row['wall_ms']:8.3f}  busy {row['busy_ms']:8.3f}  idle {idle:7.3f}  "
            f"host {row.get('host_ms', float('nan')):7.3f}  kernels {row['kernels']:6.0f} | {cats}")


def bench_rows(report: dict) -> list[dict]:
    """The trace rows (as this tool's own) of a ``candle-nn-bench --json`` report measured with
    ``--trace``: one per implementation, dtype and batch (1 and the throughput
    batch), ``wall_ms`` being the benchmark's median for that batch."""
    rows = []
    for r in report["results"]:
        for key, batch, wall in (("bs1", 1, r.get("median_ms")),
                                 ("batch", r.get("batch"), r.get("batch_median_ms"))):
            stats = r.get("trace", {}).get(key)
            if r["status"] == "ok" and stats:
                rows.append({"model": r["model"], "dtype": r["dtype"], "batch": batch,
                             "side": r["impl"], "wall_ms": wall, **stats})
    return rows


def markdown(rows: list[dict], top: int = 2) -> str:
    """A Markdown table of trace rows: wall, GPU busy, idle share, host, launches, where the GPU
    time goes (categories) and the costliest kernels."""
    lines = ["| model | dtype | batch | implementation | wall ms | GPU busy ms | idle | host ms "
             "| kernels | GPU time by kind | costliest kernels |", "|" + "---|" * 11]
    for row in rows:
        if "busy_ms" not in row:
            continue
        cats = ", ".join(f"{k} {v:.0%}" for k, v in list(row["categories"].items())[:3])
        kernels = "; ".join(f"`{k['name'][:60]}` {k['share']:.0%}" for k in row["top"][:top])
        host = row.get("host_ms")
        lines.append(f"| {row['model']} | {row['dtype']} | {row['batch']} | {row['side']} "
                     f"| {row['wall_ms']:.2f} | {row['busy_ms']:.2f} "
                     f"| {1 - row['busy_ms'] / row['wall_ms']:.0%} "
                     f"| {'-' if host is None else format(host, '.2f')} | {row['kernels']:.0f} "
                     f"| {cats} | {kernels} |")
    return "\n".join(lines) + "\n"


def _print(row: dict) -> None:
    print(_line(row), flush=True)
    if "top" in row:
        for k in row["top"][:5]:
            print(f"      {k['ms']:8.4f} ms {k['share']:5.1%} x{k['calls']:<5.0f} {k['name']}")
        print("      api: " + "; ".join(f"{a['name']} {a['ms']:.3f} ms x{a['calls']:.0f}"
                                    for a in row["api"][:3]), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_gpu_trace",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--report", nargs="+", metavar="JSON",
                   help="trace nothing: print the trace rows of saved candle-nn-bench --json runs "
                        "(made with --trace), then a Markdown table")
    p.add_argument("--side", choices=("ours", "ours+mx.compile", "torch", "torch.compile"))
    p.add_argument("--models", nargs="+", default=["resnet50", "yolov8n", "mobilesam-encoder"],
                   choices=sorted(MODELS))
    p.add_argument("--dtypes", default="float32,float16")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--iters", type=int, default=10, help="forwards per trace (default 10)")
    p.add_argument("--json", help="append the rows to this JSON-lines file")
    args = p.parse_args(argv)
    if args.report:
        from benchmarks.bench_report import read_saved_run
        from candle_nn import CandleNNError

        try:
            rows = [row for path in args.report for row in bench_rows(read_saved_run(path))]
        except CandleNNError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        for row in rows:
            _print(row)
        print(markdown(rows))
        return 0
    if args.side is None:
        p.error("--side is required (or --report)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="candle-nn-trace-") as cache_dir:
        for name in args.models:
            for dtype in args.dtypes.split(","):
                for batch in (int(b) for b in args.batches.split(",")):
                    row: dict[str, Any] = {"model": name, "dtype": dtype, "batch": batch,
                                           "side": args.side}
                    iters = args.iters if batch == 1 else max(3, args.iters // 2)
                    try:
                        if args.side.startswith("ours"):
                            row.update(trace_ours(MODELS[name], dtype, batch,
                                                  args.side.endswith("compile"), iters, cache_dir))
                        else:
                            row.update(trace_torch(MODELS[name], dtype, batch,
                                                   args.side == "torch.compile", iters))
                    except Exception as exc:  # one failing configuration must not sink the run
                        lines = [s for s in str(exc).strip().splitlines() if s.strip()]
                        row["error"] = f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:300]
                    rows.append(row)
                    _print(row)
                    if args.json:
                        with open(args.json, "a") as f:
                            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
