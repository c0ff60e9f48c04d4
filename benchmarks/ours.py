"""candle_nn's side of the benchmark: its weights file, a loaded forward, inputs, the process
set-up (threads, precision) and one timed row. Used by bench.py, bench_amg.py, bench_cpu_paths.py
and bench_gpu_trace.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.bench_models import BenchModel
from benchmarks.bench_timing import Options, result, time_calls

ROOT = Path(__file__).resolve().parent.parent
OURS, OURS_COMPILED = "candle_nn", "candle_nn+mx.compile"


def fixtures() -> Path:
    """The shared reference fixtures (``$CANDLE_NN_FIXTURES``, else ``../shared/fixtures``)."""
    from candle_nn import config

    return config.fixtures_dir(ROOT.parent / "shared" / "fixtures")


# -- ours ------------------------------------------------------------------------------------------
def _weights_file(model: BenchModel, cache_dir: str) -> tuple[str, str]:
    """``(safetensors path, where from)``: the fixture's weights, else seeded VarMap weights
    written once to ``cache_dir`` in candle's layout."""
    if model.fixture:
        path = fixtures() / model.fixture / "weights.safetensors"
        if path.is_file():
            return str(path), f"fixture {model.fixture} (float16 on disk)"
    path = Path(cache_dir) / f"{model.name}.safetensors"
    if not path.is_file():
        import candle_nn as cn

        varmap = cn.VarMap()
        model.build_ours(cn.VarBuilder.from_varmap(varmap, seed=0, device="cpu"))
        varmap.save(path)
    return str(path), "seeded VarMap (float32 on disk)"


def _materialize(forward: Any) -> None:
    import mlx.core as mx

    params = getattr(forward, "parameters", None)
    if callable(params):
        mx.eval(params())


def load_ours(model: BenchModel, device: str, dtype: str, cache_dir: str) -> tuple[Any, float, str]:
    """``(forward, load seconds, weights origin)``: read from safetensors, parameters evaluated."""
    import candle_nn as cn

    weights, origin = _weights_file(model, cache_dir)
    start = time.perf_counter()
    forward = model.build_ours(cn.VarBuilder.from_safetensors(weights, dtype=dtype, device=device))
    _materialize(forward)
    return forward, time.perf_counter() - start, origin


def run_ours(model: BenchModel, device: str, dtype: str, opts: Options, cache_dir: str,
             compiled: bool = False) -> dict:
    """candle_nn: load from safetensors, then time the forward (``mx.compile``-d if asked)."""
    impl = OURS_COMPILED if compiled else OURS
    reason = prepare_ours(device, opts)
    if reason:
        return result(impl, model, device, dtype, status="unavailable", reason=reason)
    import candle_nn as cn
    import mlx.core as mx

    forward, load_s, origin = load_ours(model, device, dtype, cache_dir)
    fn = mx.compile(forward) if compiled else forward

    def call(n: int):
        arrays = ours_inputs(model, n, dtype, opts.seed)
        return lambda: mx.eval(fn(*arrays))

    def enqueue(n: int):  # build the lazy graph and launch it; mx.eval waits
        arrays = ours_inputs(model, n, dtype, opts.seed)

        def launch():
            out = fn(*arrays)
            mx.async_eval(out)
            return lambda: mx.eval(out)
        return launch

    batch = opts.batch_for(model, device)
    timings = time_calls(call(1), call(batch), batch, opts, (enqueue(1), enqueue(batch)))
    blas = cn.info()["blas"]
    cpu_note = f"BLAS {blas['name'].split(',')[0]}, {blas['threads'] or '?'} threads"
    precision = cn.float32_precision() if dtype == "float32" else dtype
    note = f"{cpu_note if device == 'cpu' else 'float32 ' + precision}; weights: {origin}"
    return result(impl, model, device, dtype, load_s=load_s, version=cn.__version__,
                  note=note, **timings)


def prepare_ours(device: str, opts: Options) -> str | None:
    """Set up candle_nn in this worker (threads, float32 precision); why ours cannot run on
    ``device``, or None."""
    import candle_nn as cn
    import mlx.core as mx

    if opts.threads:
        cn.blas.set_num_threads(opts.threads)
    if device not in [str(d) for d in cn.Device.available()]:
        return f"MLX {mx.__version__} has no {device}"
    if opts.precision == "tf32":
        cn.set_float32_precision("tf32")
    return None


def ours_inputs(model: BenchModel, n: int, dtype: str, seed: int = 0) -> list:
    """The model's seeded inputs as MLX arrays, floating ones in ``dtype``."""
    import mlx.core as mx

    arrays = [mx.array(a) for a in model.inputs(n, seed)]
    arrays = [a.astype(getattr(mx, dtype)) if mx.issubdtype(a.dtype, mx.floating) else a
              for a in arrays]
    mx.eval(arrays)
    return arrays
