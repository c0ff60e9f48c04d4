"""The compiled CPU kernels (``candle_nn._cpu_kernels``, C++ in ``candle_nn/csrc/``), if built.

``pip install -e .`` builds them (setup.py: CMake + the system C++ compiler, against the pinned
MLX's headers and ``libmlx``, with the nanobind version MLX itself is built with). They are
custom MLX primitives whose ``eval_cpu`` runs fused, multithreaded float32 loops:

- ``bias_act(x, bias, residual, act, residual_mode)``: ``act(x + bias [+ residual])`` or
  ``act(x + bias) + residual`` in one pass, act in {identity, ReLU, SiLU, exact GELU};
- ``conv2d_fused(x, w, bias, residual, stride, padding, act, residual_mode)``: a groups-1 conv
  as a multithreaded im2col (none for 1x1 stride 1) + one ``cblas_sgemm`` + the same epilogue.
  The sgemm is the one MLX's own ``cblas_sgemm`` calls resolve to (the optimized BLAS blas.py
  binds to MLX; its address is handed over at load, :func:`sgemm_address`; nothing is linked);
  without an optimized BLAS there is none and convs stay on MLX's path;
- ``conv2d_packed(x, w_packed, bias, residual, kernel, out_channels, stride, padding, act,
  residual_mode)`` with ``pack_gemm_weight(w (N, K))``: the same conv (and Linear, as a 1x1 conv)
  on candle_nn's own packed-weight GEMM (csrc/gemm.h, AVX-512 or AVX2 micro-kernels);
  ``packed_gemm_available()`` says whether this CPU runs it, ``packed_gemm_isa()`` with which;
- ``softmax_last(x)``: softmax over the last axis.

A source checkout used through ``PYTHONPATH`` (no ``pip install``), a failed build, or another
MLX than the one they were built for leaves them out: :func:`module` is then ``None``,
:func:`status` says why, and candle_nn runs its pure-MLX paths (cpu_fast.py). They run on
``threads()`` threads: the optimized BLAS's thread count when it can say (``--threads`` of the
benchmark sets it), else ``CANDLE_NN_CPU_THREADS`` / ``OPENBLAS_NUM_THREADS`` / all cores.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
from dataclasses import dataclass
from types import ModuleType

import mlx.core as mx

from ... import blas, config
from ...ops import registry
from . import cpu_model

MODULE = "candle_nn._cpu_kernels"
BUILD_ERROR_FILE = "_cpu_kernels.build-error.txt"  # written by setup.py when the build failed
BUILT_FOR_MLX = "0.32.4"  # pyproject.toml's pin; the kernels use MLX's C++ ABI


@dataclass(frozen=True)
class NativeStatus:
    """Whether the compiled kernels are loaded, and why not (``detail``)."""

    loaded: bool
    detail: str
    threads: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {"loaded": self.loaded, "detail": self.detail, "threads": self.threads}


def _load() -> tuple[ModuleType | None, str]:
    if mx.__version__ != BUILT_FOR_MLX:
        return None, (f"built for MLX {BUILT_FOR_MLX}, this is MLX {mx.__version__}: not loaded "
                      "(their C++ ABI must match)")
    try:
        module = importlib.import_module(MODULE)
    except ImportError as exc:
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        error_file = os.path.join(here, BUILD_ERROR_FILE)
        if os.path.exists(error_file):
            with open(error_file, encoding="utf-8") as f:
                return None, f"the build failed during pip install: {f.read().strip()}"
        if "No module named" in str(exc):
            return None, ("not built: candle_nn is used from its sources without `pip install "
                          "-e .`, which compiles them")
        return None, f"{MODULE} does not load: {exc}"
    libmlx = _libmlx()
    if libmlx is None or os.path.getsize(libmlx) != module.LIBMLX_SIZE:
        return None, (f"built against another libmlx than {libmlx} (e.g. mlx-cpu, then MLX's CUDA "
                      "build installed): not loaded; `pip install -e .` rebuilds them")
    return module, f"loaded ({MODULE})"


def _libmlx() -> str | None:
    """The ``libmlx`` shared library of the MLX in use."""
    import mlx

    for location in mlx.__path__:
        for name in ("libmlx.so", "libmlx.dylib"):
            path = os.path.join(location, "lib", name)
            if os.path.exists(path):
                return path
    return None


def sgemm_address() -> int:
    """The ``cblas_sgemm`` MLX's own calls resolve to: the process's global scope first, then
    ``libmlx``'s dependencies (where blas.py binds the optimized library, as MLX's bundled
    ``libblas``'s soname). 0 when blas.py found no optimized BLAS (MLX's reference one: convs
    then stay on MLX's path)."""
    if not blas.status().optimized or sys.platform != "linux":
        return 0
    for scope in (None, "libmlx.so"):
        try:
            lib = ctypes.CDLL(scope, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL) if scope \
                else ctypes.CDLL(None)
            return ctypes.cast(lib.cblas_sgemm, ctypes.c_void_p).value or 0
        except (OSError, AttributeError):
            continue
    return 0


_module, _detail = _load()
_threads: int | None = None
if _module is not None:
    _module.set_sgemm(sgemm_address())
    registry.set_tracer_check(_module.is_tracer)


def module() -> ModuleType | None:
    """The compiled module, or ``None`` when it is not available (see :func:`status`)."""
    return _module


def threads() -> int:
    """Threads the kernels use: the BLAS's count when it can say, else the environment's / cores."""
    n = blas.num_threads()
    if n:
        return n
    if config.cpu_threads():
        return config.cpu_threads()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return os.cpu_count() or 1


def sync_threads(force: bool = False) -> None:
    """Follow the BLAS thread count (``blas.set_num_threads``) before a kernel is queued;
    ``force``: set it even if it looks unchanged (after ``set_num_threads`` was called directly).
    The first call also sets the micro-kernels for this CPU (:func:`plan`)."""
    global _threads
    if force:
        _threads = None
    if _module is not None:
        n = threads()
        if n != _threads:
            _module.set_num_threads(n)
            _threads = n
        if _plan is None:
            plan()


_plan: cpu_model.Plan | None = None


def plan() -> cpu_model.Plan:
    """The micro-kernels the packed GEMM and Winograd use on this CPU (cpu_model.py), set on
    the first call (timing both where the plan says ``measure``) and kept for the process."""
    global _plan
    if _plan is None:
        _plan = apply_plan(cpu_model.plan(cpu_model.describe(), config.cpu_isa()))
    return _plan


def apply_plan(p: cpu_model.Plan) -> cpu_model.Plan:
    """Set the kernels' micro-kernels to ``p``'s (resolving ``measure`` by timing both);
    returns the plan with what was set."""
    if _module is None:
        return p
    times: list[str] = []
    gemm, wino = p.gemm, p.winograd
    cpu = cpu_model.describe()
    isas = [isa for isa, ok in zip(cpu_model.ISAS, (cpu.has_avx512, cpu.has_avx2)) if ok]
    with mx.stream(mx.cpu):  # the kernels run on the current stream: the GPU may be the default
        if gemm == "measure":
            gemm, t = cpu_model.faster({isa: _gemm_timer(isa) for isa in isas})
            times.append(_times("gemm", t))
        if gemm in cpu_model.ISAS:
            _module.set_packed_gemm_isa(gemm)
        if wino == "measure":
            wino, t = cpu_model.faster({isa: _winograd_timer(isa) for isa in isas})
            times.append(_times("winograd", t))
    _module.set_winograd_avx512(wino == "avx512")
    why = p.why + (f" ({'; '.join(times)})" if times else "")
    return cpu_model.Plan(p.cpu, gemm, wino, why)


def _times(what: str, t: dict[str, float]) -> str:
    return f"{what} " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in t.items())


def _gemm_timer(isa: str):
    """A call that runs a (384 x 256) . (256 x 256) packed GEMM with micro-kernel ``isa``."""
    x = mx.random.normal((1, 1, 384, 256), key=mx.random.key(0), stream=mx.cpu)
    w = _module.pack_gemm_weight(mx.random.normal((256, 256), key=mx.random.key(1),
                                                  stream=mx.cpu))
    mx.eval(x, w)

    def run() -> None:
        _module.set_packed_gemm_isa(isa)
        mx.eval(_module.conv2d_packed(x, w, None, None, (1, 1), 256, (1, 1), (0, 0)))
    return run


def _winograd_timer(isa: str):
    """A call that runs a 3x3 conv (1, 24, 24, 64) -> 64 by Winograd with micro-kernel ``isa``."""
    x = mx.random.normal((1, 24, 24, 64), key=mx.random.key(2), stream=mx.cpu)
    w = mx.random.normal((64, 3, 3, 64), key=mx.random.key(3), stream=mx.cpu)
    u = _module.winograd_weights(w)
    mx.eval(x, w, u)

    def run() -> None:
        _module.set_winograd_avx512(isa == "avx512")
        mx.eval(_module.winograd_conv3x3(x, w, u, None, None, (1, 1)))
    return run


def loaded() -> bool:
    """Whether the compiled kernels are loaded."""
    return _module is not None


def float32_cpu(dtype: mx.Dtype) -> bool:
    """The common condition of every CPU implementation: float32 on the CPU device."""
    return dtype == mx.float32 and mx.default_device() == mx.cpu


def has_sgemm() -> bool:
    """Whether ``conv2d_fused`` has an optimized sgemm to call."""
    return _module is not None and _module.has_sgemm()


def status() -> NativeStatus:
    """Loaded or not, why, and the thread count."""
    return NativeStatus(_module is not None, _detail, threads() if _module is not None else None)
