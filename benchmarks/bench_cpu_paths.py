"""``python -m benchmarks.bench_cpu_paths``: candle_nn's CPU fast paths A/B, in ONE process.

Each model is loaded once and its batch-1 forward timed round-robin under three settings, so a
busy shared machine slows them alike and the ratios stay meaningful:

- ``plain``: every CPU implementation off (``candle_nn.ops.disable("cpu")``: MLX's own ops),
- ``mlx-fast``: the pure-MLX fast paths (polynomial SiLU/GELU, depthwise), the compiled kernels
  off (what a source checkout without ``pip install`` runs),
- ``native-no-conv``: the compiled element-wise kernels (epilogues, GELU, softmax) on, convs
  other than Winograd's on MLX's path (``packed_gemm`` and ``im2col`` off),
- ``native-im2col``: every compiled kernel, but 3x3 stride-1 convs by im2col instead of
  Winograd (``winograd`` off),
- ``native-no-dw-attn-ln``: every compiled kernel except the depthwise conv, the two attention
  kernels and LayerNorm (depthwise convs on the pure-MLX path, attention as transposes + matmuls
  + the softmax kernel, ``mx.fast.layer_norm``),
- ``native-blas``: every compiled kernel on, convs and Linear layers on the im2col + OpenBLAS
  sgemm conv and MLX's matmul (the packed-weight GEMM off; Winograd still on),
- ``native``: every compiled kernel (``candle_nn._cpu_kernels``) on.

Example: ``python -m benchmarks.bench_cpu_paths --threads 2 --repeat 5 --models resnet50 yolov8n``
prints each setting's median ms and the ratios of ``native`` to each other setting;
``--settings native-im2col native`` (or ``native-no-dw-attn-ln native``) times only those
(shorter runs).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import candle_nn as cn  # before mlx: picks the CPU BLAS
import mlx.core as mx
from candle_nn.backends.cpu import kernels as cpu_kernels

from benchmarks.ours import load_ours, ours_inputs
from benchmarks.bench_models import MODELS

SETTINGS = ("plain", "mlx-fast", "native-no-conv", "native-im2col", "native-no-dw-attn-ln",
            "native-blas", "native")
# what each setting switches off, by the op registry's names (candle_nn.ops.disable)
_PURE_MLX = ("silu_poly", "gelu_poly", "depthwise_shifted")
_NATIVE = tuple(sorted({r["name"] for r in cn.ops.status() if r["backend"] == "cpu"}
                       - set(_PURE_MLX)))
_OFF: dict[str, tuple[str, ...]] = {
    "plain": ("cpu",),
    "mlx-fast": _NATIVE,
    "native-no-conv": ("packed_gemm", "im2col"),  # Winograd (its own GEMM) stays
    "native-im2col": ("winograd",),
    "native-no-dw-attn-ln": ("depthwise_conv2d.depthwise", "attention_packed", "attention_heads",
                             "layer_norm.layer_norm"),
    "native-blas": ("packed_gemm",),
    "native": (),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["resnet50", "yolov8n", "mobilesam-encoder"],
                   choices=sorted(MODELS))
    p.add_argument("--threads", type=int, default=None, help="BLAS and kernel threads")
    p.add_argument("--repeat", type=int, default=5, help="timed calls per setting")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS,
                   help="the settings to time (default: all)")
    p.add_argument("--batch", type=int, default=1, help="batch size")
    args = p.parse_args(argv)
    if not cpu_kernels.loaded():
        print(f"the compiled kernels are not loaded: {cpu_kernels.status().detail}")
        return 1
    if args.threads:
        cn.blas.set_num_threads(args.threads)
    print(cn.info())
    cache_dir = tempfile.mkdtemp(prefix="candle_nn-bench-")
    for name in args.models:
        model = MODELS[name]
        forward, _, _ = load_ours(model, "cpu", "float32", cache_dir)
        inputs = ours_inputs(model, args.batch, "float32")
        settings = [s for s in SETTINGS if s in args.settings]
        times: dict[str, list[float]] = {s: [] for s in settings}
        for setting in settings:  # warm-up: compiles, first-touch allocations
            with cn.ops.disabled(*_OFF[setting]):
                mx.eval(forward(*inputs))
        for _ in range(args.repeat):
            for setting in settings:
                with cn.ops.disabled(*_OFF[setting]):
                    start = time.perf_counter()
                    mx.eval(forward(*inputs))
                    times[setting].append((time.perf_counter() - start) * 1e3)
        ms = {s: statistics.median(t) for s, t in times.items()}
        ratios = [f"native / {s} {ms['native'] / ms[s]:.2f}" for s in settings
                  if s != "native" and "native" in ms]
        print(f"{name} (batch {args.batch}): "
              + ", ".join(f"{s} {ms[s]:.1f} ms" for s in settings)
              + ("; " + ", ".join(ratios) if ratios else ""), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
