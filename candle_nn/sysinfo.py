"""``candle_nn.info()``: what this process runs on (MLX, devices, CPU BLAS, float32 policy).

``python -m candle_nn`` prints it; paste that into bug reports and benchmark notes.
"""

from __future__ import annotations

import platform
import sys


class Info(dict):
    """A plain ``dict`` (JSON-ready) whose ``str()`` is a short human-readable summary."""

    def __str__(self) -> str:
        blas = self["blas"]
        threads = f", {blas['threads']} threads" if blas.get("threads") else ""
        native = self["cpu_native"]
        cpu = self["cpu"]
        threads_native = f" [{native['threads']} threads]" if native.get("threads") else ""
        lines = [
            f"candle_nn {self['candle_nn']} on MLX {self['mlx']} "
            f"(Python {self['python']}, {self['platform']})",
            f"devices: {', '.join(self['devices'])} (default {self['default_device']})",
            f"CPU BLAS: {blas['name']} [{blas['state']}{threads}] - {blas['detail']}",
            f"CPU kernels (C++): {'loaded' if native['loaded'] else 'not loaded'}"
            f"{threads_native} - {native['detail']}; fast paths "
            f"{'on' if self['cpu_fast'] else 'off'}; conv/Linear GEMM: {self['cpu_gemm']}",
            f"CPU: {cpu['name'] or 'unknown'} ({cpu['microarchitecture']}, AVX-512 units "
            f"{cpu['avx512_width'] or 'none'}); micro-kernels: GEMM {cpu['gemm']}, Winograd "
            f"{cpu['winograd']} - {cpu['why']}",
            f"CPU malloc: {self['cpu_malloc']['state']} - {self['cpu_malloc']['detail']}",
            f"float32 precision on GPU: {self['float32_precision']}",
            "op implementations (op: name [backend], - off, ? cannot run here):",
        ]
        for row in self["ops"]:
            mark = "" if row["enabled"] and row["available"] else (
                " -" if not row["enabled"] else " ?")
            lines.append(f"  {row['op']}: {row['name']} [{row['backend']}]{mark}")
        return "\n".join(lines)


def info() -> Info:
    """A summary of the runtime, as a dict that prints nicely.

    Keys: ``candle_nn``, ``mlx`` (versions), ``python``, ``platform``, ``devices`` (e.g.
    ``["cpu", "gpu:0"]``), ``default_device``, ``blas`` (``name``, ``path``, ``state``,
    ``detail``, ``threads``: see :class:`candle_nn.blas.BlasStatus`), ``cpu_native`` (the
    compiled CPU kernels: ``loaded``, ``detail`` (why not), ``threads``; see
    backends/cpu/kernels.py), ``cpu_fast`` (whether the CPU implementations are switched on),
    ``cpu_gemm`` (what the CPU convs and Linear layers multiply with: ``"packed avx512"``/
    ``"packed avx2"`` (the packed GEMM) or ``"blas"``), ``float32_precision`` (``"exact"`` or
    ``"tf32"``), ``cpu_malloc`` (``state``, ``detail``: see candle_nn/cpu_malloc.py), ``cpu``
    (``name``, ``microarchitecture``, ``avx512_width`` and the
    micro-kernels the packed GEMM and Winograd use here, ``gemm``, ``winograd``, ``why``: see
    backends/cpu/cpu_model.py), ``ops`` (every registered implementation:
    ``candle_nn.ops.status()``).
    """
    import mlx.core as mx

    from . import ops
    from .backends.cpu import cpu_model, kernels
    from .blas import status
    from .cpu_malloc import status as malloc_status
    from .device import Device
    from .precision import float32_precision
    from .version import __version__

    rows = ops.status()
    cpu = cpu_model.describe()
    plan = kernels.plan()
    gemm = next(r for r in rows if r["op"] == "conv2d" and r["name"] == "packed_gemm")
    return Info(
        candle_nn=__version__,
        mlx=mx.__version__,
        python=platform.python_version(),
        platform=f"{sys.platform}-{platform.machine()}",
        devices=[str(d) for d in Device.available()],
        default_device=str(Device.default()),
        blas=status().as_dict(),
        cpu_native=kernels.status().as_dict(),
        cpu_fast=ops.is_enabled("cpu"),
        cpu_gemm=(f"packed {kernels.module().packed_gemm_isa()}"
                  if gemm["enabled"] and gemm["available"] else "blas"),
        float32_precision=float32_precision(),
        cpu_malloc=malloc_status().as_dict(),
        cpu={"name": cpu.name, "microarchitecture": cpu_model.microarchitecture(cpu),
             "avx512_width": cpu_model.avx512_width(cpu), "gemm": plan.gemm,
             "winograd": plan.winograd, "why": plan.why},
        ops=rows,
    )
