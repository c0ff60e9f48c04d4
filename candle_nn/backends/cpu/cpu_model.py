"""Which CPU this is, and the micro-kernels the compiled kernels use on it.

The packed GEMM (csrc/gemm.cpp) and Winograd's batched GEMMs (csrc/winograd.cpp) each have an
AVX-512 and an AVX2 + FMA micro-kernel. Which one is faster depends on the CPU, not only on its
flags: Zen 5 EPYCs (and Intel's AVX-512 server cores) execute 512-bit FMAs on full-width units,
twice the float32 work per cycle of AVX2; Zen 4 (and Zen 5's mobile parts) runs them as two
256-bit halves, the same work per cycle as AVX2, and its 32 KiB L1D is filled by the AVX-512
kernel's 32-column B micro-panel (kKc x 32 floats = 32 KiB; Zen 5 has 48 KiB). So:

- AVX-512 on full-width units: the AVX-512 kernels (``"avx512"``);
- AVX-512 on 256-bit units: both are timed on a small GEMM at first use (once per process, a few
  milliseconds) and the faster is kept (``"measured"``);
- AVX2 + FMA only (Zen 2/3, older Intel): the AVX2 kernels.

:func:`describe` reads the vendor, family, model and flags (CPUID's, as Linux's /proc/cpuinfo
shows them); :func:`plan` turns a description into a :class:`Plan` without touching the kernels
(tests inject descriptions); :func:`apply` sets the kernels' switches. ``CANDLE_NN_CPU_ISA``
(``auto``, ``avx512``, ``avx2``) overrides the choice. ``python -m candle_nn`` prints it.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ISAS = ("avx512", "avx2")


@dataclass(frozen=True)
class CpuDescription:
    """What the choice depends on: CPUID's vendor string, family and model, the feature flags
    (Linux's names: ``avx512f``, ``avx2``, ``fma``) and the model name (for messages)."""

    vendor: str = ""
    family: int = 0
    model: int = 0
    flags: frozenset[str] = field(default_factory=frozenset)
    name: str = ""

    @property
    def has_avx512(self) -> bool:
        return {"avx512f", "avx512vl", "avx512dq"} <= self.flags

    @property
    def has_avx2(self) -> bool:
        return {"avx2", "fma"} <= self.flags


def parse_cpuinfo(text: str) -> CpuDescription:
    """The first processor of a Linux ``/proc/cpuinfo``."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())

    def number(key: str) -> int:
        value = fields.get(key, "")
        return int(value) if value.isdigit() else 0

    return CpuDescription(fields.get("vendor_id", ""), number("cpu family"), number("model"),
                          frozenset(fields.get("flags", "").split()), fields.get("model name", ""))


def describe() -> CpuDescription:
    """This machine's CPU (an empty description where /proc/cpuinfo is missing: not Linux)."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return CpuDescription(name=platform.processor())


def microarchitecture(cpu: CpuDescription) -> str:
    """``"zen2"`` (Zen and Zen 2), ``"zen3"``, ``"zen4"``, ``"zen5"``, ``"zen5-mobile"``,
    ``"intel"`` or ``"other"``, from CPUID's family and model (AMD family 0x19 is Zen 3 without
    AVX-512 and Zen 4 with it; family 0x1A is Zen 5, its mobile models 0x20-0x2F and 0x60-0x7F
    with 256-bit units)."""
    if cpu.vendor == "AuthenticAMD":
        if cpu.family == 0x17:
            return "zen2"
        if cpu.family == 0x19:
            return "zen4" if cpu.has_avx512 else "zen3"
        if cpu.family == 0x1A:
            return "zen5-mobile" if 0x20 <= cpu.model <= 0x2F or 0x60 <= cpu.model <= 0x7F \
                else "zen5"
    if cpu.vendor == "GenuineIntel":
        return "intel"
    return "other"


def avx512_width(cpu: CpuDescription) -> int:
    """Bits of the units that execute an AVX-512 FMA: 0 (no AVX-512), 256 (Zen 4, Zen 5 mobile:
    two halves) or 512."""
    if not cpu.has_avx512:
        return 0
    return 256 if microarchitecture(cpu) in ("zen4", "zen5-mobile") else 512


@dataclass(frozen=True)
class Plan:
    """The micro-kernels to use: ``gemm`` and ``winograd`` each ``"avx512"`` or ``"avx2"``
    (``"none"``: the CPU has neither, the kernels keep the BLAS / baseline loops), or
    ``"measure"`` (time both at first use); ``why`` says how it was chosen."""

    cpu: str
    gemm: str
    winograd: str
    why: str


def plan(cpu: CpuDescription, override: str = "auto") -> Plan:
    """The micro-kernels for ``cpu`` (module docstring); ``override`` is ``CANDLE_NN_CPU_ISA``:
    ``auto``, or ``avx512`` / ``avx2`` where the CPU has it."""
    arch = microarchitecture(cpu)
    has = [isa for isa, ok in zip(ISAS, (cpu.has_avx512, cpu.has_avx2)) if ok]
    if override != "auto":
        if override not in ISAS:
            raise ValueError(f"CANDLE_NN_CPU_ISA={override!r}: use auto, avx512 or avx2")
        if override in has:
            return Plan(arch, override, override, "CANDLE_NN_CPU_ISA")
        # a machine without it runs what it has, and says so
        best = has[0] if has else "none"
        return Plan(arch, best, best, f"CANDLE_NN_CPU_ISA={override} (not on this CPU)")
    if not has:
        return Plan(arch, "none", "none", "no AVX-512F or AVX2 + FMA")
    width = avx512_width(cpu)
    if width == 512:
        return Plan(arch, "avx512", "avx512", "AVX-512 on 512-bit units")
    if width == 256:
        return Plan(arch, "measure", "measure",
                    "AVX-512 on 256-bit units: the faster kernel, timed at first use")
    return Plan(arch, "avx2", "avx2", "AVX2 + FMA")


def faster(candidates: dict[str, Callable[[], None]], rounds: int = 7, margin: float = 0.1,
           clock: Callable[[], float] = time.perf_counter) -> tuple[str, dict[str, float]]:
    """The first of ``candidates`` (each a call to time) unless another is more than ``margin``
    faster, and each one's best time in seconds: ``rounds`` interleaved passes (A B A B ...), the
    minimum of each kept, so a pass slowed by another process does not decide, and near-equal
    kernels keep the first."""
    best = {name: float("inf") for name in candidates}
    for fn in candidates.values():  # warm-up: first-call costs out of the timing
        fn()
    for _ in range(rounds):
        for name, fn in candidates.items():
            start = clock()
            fn()
            best[name] = min(best[name], clock() - start)
    first = next(iter(best))
    fastest = min(best, key=best.__getitem__)
    return (fastest if best[fastest] * (1 + margin) < best[first] else first), best
