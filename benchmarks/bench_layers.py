"""``python -m benchmarks.bench_layers``: candle_nn's convolutions and Linear layers one by one
against ONNX Runtime's nodes, for one model at one batch size, on the CPU.

- ours: every ``Conv2d`` / ``Linear`` module's input is captured in one forward, then the module
  is timed alone on it (the minimum of ``--repeat`` calls, each evaluated): the layer's kernel
  with its input and weights in cache. ``--cold`` reads a buffer larger than the last-level
  cache before each timed call (a read: no dirty lines written back during the call), so the
  weights, input and residual come from memory: an upper bound of the layer inside a forward,
  where a large model's weights come from memory and the activations mostly from L3;
- ONNX Runtime: the PyTorch reference exported and run as ``bench_peers`` does (same session
  options), timed by its node profiler (each node's kernel time, the minimum over the profiled
  runs): nodes inside a whole forward, whose weights come from memory. A Conv node includes the
  ReLU / Add it fused.

ResNets are matched layer by layer (torchvision's ``layerN.B`` nodes: ``relu`` is the block's
first conv, ``relu_1`` its second, ``conv3`` the third with the residual add; ``downsample``;
the stem's conv is ``relu``); every model gets the totals per layer type. Pin it to one core
and thread on a shared machine: ``taskset -c 1 python -m benchmarks.bench_layers --model
resnet50 --threads 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from collections import defaultdict
from typing import Any

import candle_nn as cn  # before mlx: picks the CPU BLAS
import mlx.core as mx
import numpy as np

from benchmarks.bench_models import MODELS, BenchModel
from benchmarks.bench_profile import layer_type
from benchmarks.bench_timing import Options
from benchmarks.ours import load_ours, ours_inputs

Times = dict[str, tuple[str, float]]  # name -> (layer or op type, ms)


COLD_BYTES = 256 << 20  # read before each ``cold`` call: above any CPU's last-level cache


def ours_layers(model: BenchModel, batch: int, repeat: int, cache_dir: str,
                cold: bool = False) -> Times:
    """Each Conv2d / Linear module of our model timed alone on its input (ms, min of
    ``repeat``), by module path; ``cold``: the caches flushed before each timed call."""
    forward, _, _ = load_ours(model, "cpu", "float32", cache_dir)
    inputs = tuple(ours_inputs(model, batch, "float32"))
    leaves = {id(m): path for path, m in forward.named_modules()
              if type(m).__name__ in ("Conv2d", "Linear")}
    captured: dict[str, tuple[Any, tuple, dict]] = {}
    original = cn.Module.__call__

    def capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        path = leaves.get(id(self))
        if path is not None and path not in captured:
            mx.eval([a for a in (*args, *kwargs.values()) if isinstance(a, mx.array)])
            captured[path] = (self, args, kwargs)
        return original(self, *args, **kwargs)

    cn.Module.__call__ = capture
    try:
        mx.eval(forward(*inputs))
    finally:
        cn.Module.__call__ = original
    flush = np.ones(COLD_BYTES // 4, np.float32) if cold else None
    times: Times = {}
    for path, (module, args, kwargs) in captured.items():
        for _ in range(2):
            mx.eval(module(*args, **kwargs))
        best = float("inf")
        for _ in range(repeat):
            if flush is not None:
                flush.sum()
            start = time.perf_counter()
            mx.eval(module(*args, **kwargs))
            best = min(best, time.perf_counter() - start)
        times[path] = (layer_type(module), 1e3 * best)
    return times


def ort_nodes(model: BenchModel, batch: int, threads: int | None, runs: int) -> Times:
    """ONNX Runtime's kernel time per node (ms, min over ``runs`` profiled runs after two
    warm-up runs), by node name."""
    import onnxruntime as ort

    from benchmarks.bench_peers import _export, _torch_inputs

    module = model.build_torch().eval()
    example = _torch_inputs(model, batch, "cpu", "float32", Options())
    names = [f"input{i}" for i in range(len(example))]
    feed = {name: np.ascontiguousarray(a.numpy()) for name, a in zip(names, example)}
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{model.name}-{batch}.onnx")
        _export(module, example, names, path)
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "profile")
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        for _ in range(2 + runs):
            session.run(None, feed)
        with open(session.end_profiling(), encoding="utf-8") as f:
            events = json.load(f)
    per_node: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_node[e["name"][:-len("_kernel_time")]].append((e["dur"], e["args"]["op_name"]))
    return {name: (runs_[0][1], min(d for d, _ in runs_[2:] or runs_) / 1e3)
            for name, runs_ in per_node.items()}


_RESNET_NODE = re.compile(r"/layer(\d)/layer\d\.(\d+)/(relu_1|relu|conv3|downsample)\b")
_RESNET_CONV = {"relu": "convs.0", "relu_1": "convs.1", "conv3": "convs.2",
                "downsample": "downsample"}


def resnet_layer(node: str) -> str | None:
    """Our module path for a torchvision ResNet node (``/layer2/layer2.0/relu_1/Relu`` ->
    ``stages.1.0.convs.1``, ``/relu/Relu`` -> ``stem``); None for other nodes."""
    m = _RESNET_NODE.match(node)
    if m:
        return f"stages.{int(m[1]) - 1}.{m[2]}.{_RESNET_CONV[m[3]]}"
    if node.startswith("/relu/") or node.startswith("/conv1/"):
        return "stem"
    if node.startswith("/fc/"):
        return "fc"
    return None


def table(ours: Times, ort: Times, resnet: bool) -> str:
    """Markdown: per layer (ResNets), then per layer type, ours vs ONNX Runtime."""
    lines = []
    matched: dict[str, float] = defaultdict(float)
    if resnet:
        for node, (_, ms) in ort.items():
            layer = resnet_layer(node)
            if layer is not None:
                matched[layer] += ms
        lines += ["| layer | type | ours ms | ORT ms | ours / ORT |", "|---|---|---|---|---|"]
        for path, (kind, ms) in ours.items():
            theirs = matched.get(path)
            ratio = f"{ms / theirs:.2f}" if theirs else ""
            lines.append(f"| {path} | {kind} | {ms:.2f} | "
                         f"{'' if theirs is None else f'{theirs:.2f}'} | {ratio} |")
        lines.append("")
    ours_by_type: dict[str, float] = defaultdict(float)
    for kind, ms in ours.values():
        ours_by_type[kind] += ms
    ort_by_type: dict[str, float] = defaultdict(float)
    for kind, ms in ort.values():
        ort_by_type[kind] += ms
    lines += ["| ours: layer type | ms | | ONNX Runtime: op | ms |", "|---|---|---|---|---|"]
    a = sorted(ours_by_type.items(), key=lambda kv: -kv[1])
    b = sorted(ort_by_type.items(), key=lambda kv: -kv[1])
    for i in range(max(len(a), len(b))):
        left = f"{a[i][0]} | {a[i][1]:.2f}" if i < len(a) else " | "
        right = f"{b[i][0]} | {b[i][1]:.2f}" if i < len(b) else " | "
        lines.append(f"| {left} | | {right} |")
    lines.append(f"| total | {sum(ours_by_type.values()):.2f} | | total | "
                 f"{sum(ort_by_type.values()):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_layers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50", choices=sorted(
        name for name, m in MODELS.items() if not m.train and not m.pipeline))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=None,
                   help="threads for both (candle_nn's kernels, ONNX Runtime intra-op)")
    p.add_argument("--repeat", type=int, default=15, help="timed calls per layer / profiled "
                   "ONNX Runtime runs")
    p.add_argument("--cold", action="store_true", help="flush the caches before each of our "
                   "timed calls (weights and activations from memory)")
    p.add_argument("--json", metavar="PATH", help="also write both sides' times as JSON")
    args = p.parse_args(argv)
    if args.batch < 1 or args.repeat < 1:
        p.error("--batch and --repeat must be at least 1")
    if args.threads:
        cn.blas.set_num_threads(args.threads)
    model = MODELS[args.model]
    with tempfile.TemporaryDirectory(prefix="candle_nn-bench-") as cache_dir:
        ours = ours_layers(model, args.batch, args.repeat, cache_dir, args.cold)
    cpu = cn.info()["cpu"]
    print(f"{model.name}, batch {args.batch}, threads {args.threads or 'default'}"
          f"{', ours cold' if args.cold else ''}; "
          f"{cpu['name']} ({cpu['microarchitecture']}; GEMM {cpu['gemm']}, Winograd "
          f"{cpu['winograd']})")
    try:
        ort = ort_nodes(model, args.batch, args.threads, args.repeat)
    except ImportError as exc:
        print(f"ONNX Runtime side skipped: {exc} (pip install 'candle-nn-mlx[bench]')")
        ort = {}
    print(table(ours, ort, args.model.startswith("resnet")))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"ours": ours, "onnxruntime": ort}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
