"""``candle-nn-bench``: candle_nn's models against PyTorch and ONNX Runtime, in one run.

Run from the repository root as ``python -m benchmarks`` (a repository tool, not installed).

For each model (benchmarks/bench_models.py), device and dtype it measures load time, first-call
latency, steady batch-1 latency (median, p90) and throughput at a larger batch, for candle_nn
(optionally under ``mx.compile``), PyTorch (eager, optionally ``torch.compile``) and the PyTorch
model exported to ONNX and run by ONNX Runtime, then prints a table with the ratios ours/theirs,
and writes JSON (``--json``) and a PNG chart (``--chart``).

Each implementation runs in its own fresh Python process by default, so thread pools and BLAS
libraries of one cannot slow down another (PyTorch's OpenMP threads spin after a call; candle_nn
preloads OpenBLAS); ``--in-process`` runs everything here instead (faster, for smoke tests).

    python -m benchmarks --threads 2 --json bench.json    # every model, every device
    python -m benchmarks --json b.json --markdown b.md     # also a Markdown table for the README
    python -m benchmarks --report b.json                   # print a saved run's table again
    python -m benchmarks --report a.json b.json --json c.json  # merge runs into one
    python -m benchmarks --quick                           # smoke run: ResNet-18, few iterations
    python -m benchmarks --models resnet50-train --device cpu  # training steps vs PyTorch
    python -m benchmarks --models mobilesam-amg --repeat 1  # automatic masks vs MobileSAM's own
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from benchmarks.bench_models import MODELS, QUICK_MODELS
from benchmarks.bench_timing import Options, result
from benchmarks.ours import OURS, OURS_COMPILED, load_ours, ours_inputs, run_ours

ROOT = Path(__file__).resolve().parent.parent
PEERS = ("torch", "torch.compile", "onnxruntime")
DTYPES = ("float32", "float16", "bfloat16")


def _profile(args: argparse.Namespace, opts: Options, cache_dir: str) -> int:
    """``--profile``: self time per module for each model (ours only, in this process)."""
    from benchmarks.bench_profile import profile

    import candle_nn as cn

    if args.threads:
        cn.blas.set_num_threads(args.threads)
    for name in args.models:
        model = MODELS[name]
        for device in _devices(args.device):
            for dtype in (args.dtypes or "float32").split(","):
                if model.pipeline:
                    from benchmarks import bench_amg

                    print(f"[{device} float32] " + bench_amg.profile(model, device, opts,
                                                                     cache_dir))
                    break
                forward, _, _ = load_ours(model, device, dtype, cache_dir)
                print(f"[{device} {dtype}] " + profile(model, forward,
                                                       tuple(ours_inputs(model, 1, dtype))))
    return 0


# -- one job ---------------------------------------------------------------------------------------
def run_job(job: dict) -> dict:
    """Run one (impl, model, device, dtype) measurement; never raises."""
    model = MODELS[job["model"]]
    opts = Options(**job["options"])
    impl, device, dtype = job["impl"], job["device"], job["dtype"]
    try:
        if model.train:
            from benchmarks import bench_train

            if impl in (OURS, OURS_COMPILED):
                return bench_train.run_ours_train(model, device, opts, impl == OURS_COMPILED)
            mode = None if impl == "torch" else _torch_compile_mode(device)
            return bench_train.run_torch_train(model, device, opts, compile_mode=mode)
        if model.pipeline:
            from benchmarks import bench_amg

            run = bench_amg.run_ours if impl == OURS else bench_amg.run_torch
            return run(model, device, dtype, opts, job["cache_dir"])
        if impl in (OURS, OURS_COMPILED):
            return run_ours(model, device, dtype, opts, job["cache_dir"], impl == OURS_COMPILED)
        from benchmarks import bench_peers

        if impl == "torch":
            return bench_peers.run_torch(model, device, dtype, opts)
        if impl == "torch.compile":
            return bench_peers.run_torch(model, device, dtype, opts,
                                         compile_mode=_torch_compile_mode(device))
        return bench_peers.run_onnxruntime(model, device, dtype, opts)
    except Exception as exc:  # one failing measurement must not sink the run
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        reason = f"{type(exc).__name__}: {first}"
        return result(impl, model, device, dtype, status="error", reason=reason[:300])


def _torch_compile_mode(device: str) -> str:
    return "max-autotune-no-cudagraphs" if device == "cpu" else "reduce-overhead"


def _run_isolated(job: dict, timeout_s: float) -> dict:
    """:func:`run_job` in a fresh interpreter (threads set through the environment too)."""
    env = dict(os.environ)
    threads = job["options"].get("threads")
    if threads:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("YOLO_OFFLINE", "1")
    try:
        done = subprocess.run([sys.executable, "-m", "benchmarks", "--worker", json.dumps(job)],
                              capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return result(job["impl"], MODELS[job["model"]], job["device"], job["dtype"],
                      status="error", reason=f"timed out after {timeout_s:.0f} s")
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return result(job["impl"], MODELS[job["model"]], job["device"], job["dtype"], status="error",
                  reason=f"worker exited {done.returncode}: {tail[:300]}")


def _best(kept: dict | None, new: dict) -> dict:
    """Merge one more round of a row: each figure keeps its best value (lowest time, highest
    throughput), which filters out interference from other processes; ``rounds_median_ms``
    lists every round's batch-1 median."""
    if kept is None or kept["status"] != "ok":
        if new["status"] == "ok":
            new["rounds_median_ms"] = [new["median_ms"]]
        return new if kept is None or new["status"] == "ok" else kept
    if new["status"] != "ok":
        return kept
    merged = dict(kept)
    merged["rounds_median_ms"] = kept["rounds_median_ms"] + [new["median_ms"]]
    if new["median_ms"] < kept["median_ms"]:
        merged.update(median_ms=new["median_ms"], p90_ms=new["p90_ms"], runs=new["runs"])
    if new["throughput_ips"] > kept["throughput_ips"]:
        merged.update(throughput_ips=new["throughput_ips"], batch_median_ms=new["batch_median_ms"])
    for key in ("load_s", "first_s"):
        merged[key] = min(kept[key], new[key])
    return merged


# -- the run ---------------------------------------------------------------------------------------
def _devices(spec: str) -> list[str]:
    """``all`` → every device MLX has; else the named ones (``gpu`` → ``gpu:0``), kept even when
    absent so that each row says it is unavailable."""
    import candle_nn as cn
    from candle_nn.device import parse_device_name

    if spec == "all":
        return [str(d) for d in cn.Device.available()]
    names = []
    for item in spec.split(","):
        try:
            kind, index = parse_device_name(item)
        except cn.DeviceUnavailableError as exc:
            raise SystemExit(f"error: {exc} (or 'all')") from None
        names.append("cpu" if kind == "cpu" else f"gpu:{index}")
    return list(dict.fromkeys(names))


def _jobs(args: argparse.Namespace, opts: Options, cache_dir: str) -> list[dict]:
    jobs = []
    for name in args.models:
        for device in _devices(args.device):
            on_gpu = device != "cpu"
            compiled = args.compile in ("on", "only") or (args.compile == "auto" and on_gpu)
            impls = (([] if args.compile == "only" else [OURS])
                     + ([OURS_COMPILED] if compiled else []))
            peers = args.peers or ("torch,torch.compile" if on_gpu else "torch,onnxruntime")
            peers = [] if peers == "none" else [p for p in peers.split(",") if p]
            unknown = sorted(set(peers) - set(PEERS))
            if unknown:
                raise SystemExit(f"error: unknown peer(s) {unknown}: "
                                 f"choose from {', '.join(PEERS)}")
            dtypes = args.dtypes.split(",") if args.dtypes else (
                list(DTYPES) if on_gpu and not args.quick else ["float32"])
            if MODELS[name].pipeline:  # benchmarks/bench_amg.py: ours and PyTorch eager, float32
                impls, peers, dtypes = [OURS], [p for p in peers if p == "torch"], ["float32"]
            if MODELS[name].train:  # benchmarks/bench_train.py: float32 steps against PyTorch
                peers, dtypes = [p for p in peers if p.startswith("torch")], ["float32"]
            for dtype in dtypes:
                if dtype not in DTYPES:
                    raise SystemExit(f"error: bad dtype {dtype!r}: use {', '.join(DTYPES)}")
                for impl in impls + peers:
                    jobs.append({"impl": impl, "model": name, "device": device, "dtype": dtype,
                                 "options": opts.as_dict(), "cache_dir": cache_dir})
    return jobs


def _meta(args: argparse.Namespace, opts: Options, argv: Sequence[str]) -> dict:
    from importlib import metadata

    import candle_nn as cn

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), None)
    return {"command": "python -m benchmarks " + " ".join(argv),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "quick": args.quick, "rounds": args.rounds, "isolated": not args.in_process,
            "options": opts.as_dict(),
            "cpu": cpu, "cpu_count": os.cpu_count(), "info": dict(cn.info()),
            "versions": {d: version(d) for d in ("torch", "torchvision", "ultralytics",
                                                 "onnxruntime", "onnx", "mobilesam-mirror")}}


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=None,
                   help="models to measure (default: all; --quick: resnet18 and resnet18-train)")
    p.add_argument("--device", default="all",
                   help="cpu, gpu, gpu:N, a comma list, or all (default)")
    p.add_argument("--dtypes", default=None,
                   help="comma list of float32,float16,bfloat16 (default: float32 on the CPU, "
                        "all three on a GPU)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for every implementation (BLAS, torch, ONNX Runtime intra-op)")
    p.add_argument("--batch", type=int, default=None,
                   help="throughput batch (default: per model on the CPU, 32 on a GPU)")
    p.add_argument("--repeat", type=int, default=None, help="timed calls per figure (default 20)")
    p.add_argument("--amg-points", type=int, default=None,
                   help="mobilesam-amg: prompt grid points per side (default 32, MobileSAM's)")
    p.add_argument("--peers", default=None,
                   help=f"comma list from {', '.join(PEERS)}, or none (default: torch,onnxruntime "
                        "on the CPU; torch,torch.compile (CUDA graphs) on a GPU)")
    p.add_argument("--compile", choices=("auto", "on", "off", "only"), default="auto",
                   help="also measure candle_nn under mx.compile (auto: on GPUs only; on the CPU "
                        "it is slower and its first call compiles C++ for seconds); only: "
                        "candle_nn under mx.compile alone, without its eager row")
    p.add_argument("--precision", choices=("exact", "tf32"), default="exact",
                   help="float32 on GPUs, for ours and PyTorch alike (default exact)")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure everything N times, round-robin, and keep each figure's best "
                        "(use 3 on a shared, noisy machine)")
    p.add_argument("--quick", action="store_true", help="smoke run: few iterations, batch 2")
    p.add_argument("--trace", action="store_true",
                   help="also record the GPU kernel/idle trace of the timed calls (JSON 'trace')")
    p.add_argument("--in-process", action="store_true",
                   help="run every implementation in this process (default: one process each)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write a Markdown results table (README)")
    p.add_argument("--chart", metavar="PATH",
                   help="write a PNG chart (default: beside --json; needs matplotlib)")
    p.add_argument("--report", metavar="JSON", nargs="+",
                   help="measure nothing: print (and --markdown/--chart) a saved --json run; "
                        "several runs: merged into one table (and --json file)")
    p.add_argument("--profile", action="store_true",
                   help="instead of comparing: print where candle_nn's forward spends its time "
                        "(self time per module class and the costliest modules), batch 1")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per isolated job")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks`` (failures: one ``error:`` line, exit status 1)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--worker" in argv:  # a peer's worker process must not import candle_nn (BLAS preload)
        return _main(argv)
    from candle_nn_models.scripts.common import run_main

    return run_main(_main, argv, json_document=False)  # its --json names a file


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.worker:  # internal: one job in this fresh process, result as the last stdout line
        print(json.dumps(run_job(json.loads(args.worker))))
        return 0
    from candle_nn import CandleNNError
    from benchmarks import bench_report

    for out in (args.json, args.markdown, args.chart):  # fail before minutes of measuring
        if out:
            _check_writable(out)
    if args.report:
        reports = [bench_report.read_saved_run(path) for path in args.report]
        report = reports[0] if len(reports) == 1 else bench_report.merge(reports)
        if args.json:
            if len(reports) > 1:
                report["meta"]["command"] = "python -m benchmarks " + " ".join(argv)
            bench_report.write_json(report, args.json)
        _emit(report, args)
        return 0
    args.models = args.models or list(QUICK_MODELS if args.quick else MODELS)
    if args.rounds < 1:
        raise SystemExit("error: --rounds must be at least 1")
    if args.amg_points is not None and args.amg_points < 1:
        raise SystemExit("error: --amg-points must be at least 1")
    settings = {"threads": args.threads, "batch": args.batch, "precision": args.precision,
                "trace": args.trace}
    if args.repeat:
        settings["repeat"] = args.repeat
    if args.amg_points:
        settings["amg_points"] = args.amg_points
    opts = Options.quick(**settings) if args.quick else Options(**settings)
    import candle_nn as cn

    if "cpu" in args.device or args.device == "all":
        cn.blas.warn_if_slow_cpu()
    if args.threads:
        cn.blas.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="candle-nn-bench-") as cache_dir:
        if args.profile:
            return _profile(args, opts, cache_dir)
        jobs = _jobs(args, opts, cache_dir)
        meta = _meta(args, opts, argv)
        print(f"candle-nn-bench: {len(jobs)} measurements; "
              f"CPU BLAS: {meta['info']['blas']['name']}", file=sys.stderr)
        rows: list[dict | None] = [None] * len(jobs)
        for r in range(1, args.rounds + 1):  # round-robin, so that interference hits every row
            for i, job in enumerate(jobs):
                print(f"[{f'round {r}, ' if args.rounds > 1 else ''}{i + 1}/{len(jobs)}] "
                      f"{job['model']} {job['device']} {job['dtype']} {job['impl']}",
                      file=sys.stderr, flush=True)
                row = run_job(job) if args.in_process else _run_isolated(job, args.timeout)
                rows[i] = _best(rows[i], row)
    report = bench_report.build(meta, rows)

    try:
        if args.json:
            bench_report.write_json(report, args.json)
            print(f"wrote {args.json}", file=sys.stderr)
        _emit(report, args)
    except OSError as exc:
        raise CandleNNError(f"cannot write the results: {exc}") from None
    return 0


def _check_writable(path: str) -> None:
    from candle_nn import CandleNNError

    folder = Path(path).parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise CandleNNError(f"cannot write {path}: folder {folder} does not exist or is not "
                            "writable")


def _emit(report: dict, args: argparse.Namespace) -> None:
    """The terminal table, and the Markdown table and chart when asked for."""
    from benchmarks import bench_report

    print(bench_report.table(report))
    if args.markdown:
        bench_report.write_markdown(report, args.markdown)
        print(f"wrote {args.markdown}", file=sys.stderr)
    chart = args.chart or (str(Path(args.json).with_suffix(".png")) if args.json else None)
    if chart:
        print(bench_report.write_chart(report, chart), file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
