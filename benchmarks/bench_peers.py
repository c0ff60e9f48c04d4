"""The peers ``candle-nn-bench`` compares against: PyTorch (eager or ``torch.compile``) and the
same PyTorch model exported to ONNX and run by ONNX Runtime.

Each ``run_*`` returns a result dict (see benchmarks/bench.py ``_result``) and imports its library
lazily, so a missing peer is reported as unavailable rather than failing the run.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.bench_models import BenchModel
from benchmarks.bench_timing import Options, result, time_calls

def _torch() -> Any:
    import torch

    return torch


def _torch_unavailable(model: BenchModel, no_torch: str, needs: str) -> str | None:
    """Why ``model``'s PyTorch reference cannot be built here, or None when it can."""
    try:
        _torch()
    except ImportError:
        return no_torch
    return f"{needs} {model.torch_missing}" if model.torch_missing else None


def _torch_device(device: str) -> str:
    return "cpu" if device == "cpu" else "cuda:" + (device.split(":")[1] if ":" in device else "0")


def _place(module: Any, device: str, dtype: str, opts: Options) -> Any:
    """Move an eval-mode module to the benchmark's device and dtype (channels_last on GPUs)."""
    torch = _torch()
    # eval() after the cast: ultralytics' TinyViT caches its attention biases in eval(), and a
    # cache made before .to(float16) stays float32 ("expected scalar type Float but found Half").
    module = module.to(device=_torch_device(device), dtype=getattr(torch, dtype)).eval()
    if opts.channels_last and device != "cpu":
        module = module.to(memory_format=torch.channels_last)
    return module


def _load_timed(model: BenchModel) -> tuple[Any, float, str]:
    """``(module, seconds, how)``: a saved state dict read into a module built on the meta device
    (no random init, as a user loading a checkpoint would), else built and initialised."""
    torch = _torch()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "weights.pt")
        torch.save(model.build_torch().state_dict(), path)
        start = time.perf_counter()
        try:
            with torch.device("meta"):
                module = model.build_torch()
            module.load_state_dict(torch.load(path, mmap=True, weights_only=True), assign=True)
            how = "state dict into a meta-device module"
        except Exception:  # some reference code cannot be built on the meta device
            start = time.perf_counter()
            module = model.build_torch()
            module.load_state_dict(torch.load(path, weights_only=True))
            how = "build with random init + state dict"
        return module, time.perf_counter() - start, how


def _torch_inputs(model: BenchModel, n: int, device: str, dtype: str, opts: Options) -> tuple:
    torch = _torch()
    image, *extra = model.inputs(n, opts.seed)
    x = torch.from_numpy(np.ascontiguousarray(image.transpose(0, 3, 1, 2)))
    x = x.to(device=_torch_device(device), dtype=getattr(torch, dtype))
    if opts.channels_last and device != "cpu" and x.ndim == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    rest = [torch.from_numpy(a).to(_torch_device(device)) for a in extra]
    rest = [r.to(x.dtype) if r.is_floating_point() else r for r in rest]
    return (x, *rest)


def run_torch(model: BenchModel, device: str, dtype: str, opts: Options,
              compile_mode: str | None = None) -> dict:
    """PyTorch eager (``compile_mode=None``) or ``torch.compile(mode=compile_mode)``."""
    impl = "torch" if compile_mode is None else f"torch.compile({compile_mode})"
    reason = _torch_unavailable(model, "torch not installed (pip install 'candle-nn-mlx[bench]')",
                                "reference needs")
    if reason:
        return result(impl, model, device, dtype, status="unavailable", reason=reason)
    torch = _torch()
    if device != "cpu" and not torch.cuda.is_available():
        return result(impl, model, device, dtype, status="unavailable",
                      reason="this torch has no CUDA")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    tf32 = opts.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32  # like with like: exact float32 unless asked
    torch.backends.cudnn.allow_tf32 = tf32

    def sync() -> None:
        if device != "cpu":
            torch.cuda.synchronize()

    module, load_s, how = _load_timed(model)
    module = _place(module, device, dtype, opts)
    forward = torch.compile(module, mode=compile_mode) if compile_mode else module

    def call(inputs: tuple) -> Any:
        def run() -> None:
            with torch.inference_mode():
                forward(*inputs)
            sync()
        return run

    def enqueue(inputs: tuple) -> Any:  # returns once the kernels are launched
        def launch() -> Any:
            with torch.inference_mode():
                forward(*inputs)
            return sync
        return launch

    batch = opts.batch_for(model, device)
    one = _torch_inputs(model, 1, device, dtype, opts)
    many = _torch_inputs(model, batch, device, dtype, opts)
    timings = time_calls(call(one), call(many), batch, opts, (enqueue(one), enqueue(many)))
    return result(impl, model, device, dtype, load_s=load_s, version=torch.__version__,
                  note=f"{_torch_note(device, dtype, opts)}; load: {how}", **timings)


def _torch_note(device: str, dtype: str, opts: Options) -> str:
    parts = [f"{opts.threads or 'default'} threads" if device == "cpu" else "cuDNN"]
    if device != "cpu" and dtype == "float32":
        parts.append("TF32" if opts.precision == "tf32" else "exact float32 (TF32 off)")
    if device != "cpu" and opts.channels_last:
        parts.append("channels_last")
    return ", ".join(parts)


def _export(module: Any, example: tuple, names: list[str], path: str) -> None:
    """TorchScript-based export (opset 17); the dynamo exporter (needs onnxscript) when the
    reference does not trace (MobileSAM's mask decoder)."""
    torch = _torch()
    try:
        with torch.inference_mode():
            torch.onnx.export(module, example, path, input_names=names, opset_version=17,
                              dynamo=False)
    except Exception as first:
        if importlib.util.find_spec("onnxscript") is None:
            raise RuntimeError(f"TorchScript export failed ({type(first).__name__}) and the "
                               "dynamo exporter needs onnxscript") from first
        torch.onnx.export(module, example, path, input_names=names, opset_version=18,
                          dynamo=True, external_data=False, verbose=False)


def run_onnxruntime(model: BenchModel, device: str, dtype: str, opts: Options) -> dict:
    """The PyTorch reference exported to ONNX (opset 17, dynamic batch), run by ONNX Runtime."""
    impl = "onnxruntime"
    try:
        import onnxruntime as ort
    except ImportError:
        return result(impl, model, device, dtype, status="unavailable",
                      reason="onnxruntime not installed (pip install 'candle-nn-mlx[bench]')")
    reason = _torch_unavailable(model, "exporting to ONNX needs torch", "export needs")
    if reason:
        return result(impl, model, device, dtype, status="unavailable", reason=reason)
    if dtype != "float32":
        return result(impl, model, device, dtype, status="unavailable",
                      reason="benchmarked in float32 only")
    providers = ["CPUExecutionProvider"] if device == "cpu" else ["CUDAExecutionProvider"]
    if providers[0] not in ort.get_available_providers():
        return result(impl, model, device, dtype, status="unavailable",
                      reason=f"{providers[0]} not in this onnxruntime")
    module = model.build_torch().eval()
    batch = opts.batch_for(model, device)
    options = ort.SessionOptions()
    if opts.threads:
        options.intra_op_num_threads = opts.threads
        options.inter_op_num_threads = 1
    # One export per batch size: static shapes export every reference (TinyViT's dynamic
    # reshapes do not export with a symbolic batch) and let ONNX Runtime specialise.
    sessions, feeds, load_s = {}, {}, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, batch):
            example = _torch_inputs(model, n, "cpu", "float32", opts)
            names = [f"input{i}" for i in range(len(example))]
            path = os.path.join(tmp, f"{model.name}-{n}.onnx")
            _export(module, example, names, path)
            start = time.perf_counter()
            sessions[n] = ort.InferenceSession(path, options, providers=providers)
            if n == 1:
                load_s = time.perf_counter() - start
            feeds[n] = {name: np.ascontiguousarray(a.numpy()) for name, a in zip(names, example)}

    def call(n: int):
        return lambda: sessions[n].run(None, feeds[n])

    timings = time_calls(call(1), call(batch), batch, opts)
    return result(impl, model, device, dtype, load_s=load_s, version=ort.__version__,
                  note=f"{opts.threads or 'default'} intra-op threads, {providers[0]}, "
                       "static shapes; load: InferenceSession", **timings)
