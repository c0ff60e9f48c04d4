"""The per-CPU choice of micro-kernels (candle_nn/backends/cpu/cpu_model.py): CPUs described by
their /proc/cpuinfo (injected, so every kind is checked on any machine), the plan for each, the
first-use timing's decision rule (a fake clock) and the switches it sets on this machine."""

from __future__ import annotations

import pytest

import candle_nn as cn
from candle_nn.backends.cpu import cpu_model, kernels

AVX2 = "fpu sse sse2 avx fma avx2 bmi2"
AVX512 = AVX2 + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16"


def _cpuinfo(vendor: str, family: int, model: int, flags: str, name: str = "x") -> str:
    one = (f"processor\t: {{}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\n"
           f"model\t\t: {model}\nmodel name\t: {name}\nflags\t\t: {flags}\n\n")
    return one.format(0) + one.format(1)


CPUS = {  # name: (cpuinfo, microarchitecture, AVX-512 unit width, plan's gemm)
    "EPYC 7B13 (Milan)": (_cpuinfo("AuthenticAMD", 25, 1, AVX2), "zen3", 0, "avx2"),
    "EPYC 9654 (Genoa)": (_cpuinfo("AuthenticAMD", 25, 17, AVX512), "zen4", 256, "measure"),
    "EPYC 9B14 (Genoa)": (_cpuinfo("AuthenticAMD", 25, 160, AVX512), "zen4", 256, "measure"),
    "EPYC 9755 (Turin)": (_cpuinfo("AuthenticAMD", 26, 2, AVX512), "zen5", 512, "avx512"),
    "EPYC 9965 (Turin dense)": (_cpuinfo("AuthenticAMD", 26, 17, AVX512), "zen5", 512, "avx512"),
    "Ryzen AI 9 (Strix Point)": (_cpuinfo("AuthenticAMD", 26, 36, AVX512), "zen5-mobile", 256,
                                 "measure"),
    "EPYC 7742 (Rome)": (_cpuinfo("AuthenticAMD", 23, 49, AVX2), "zen2", 0, "avx2"),
    "Xeon 8480 (Sapphire Rapids)": (_cpuinfo("GenuineIntel", 6, 143, AVX512), "intel", 512,
                                    "avx512"),
    "Xeon E5 (no FMA)": (_cpuinfo("GenuineIntel", 6, 45, "fpu sse sse2 avx"), "intel", 0, "none"),
}


@pytest.mark.parametrize("name", sorted(CPUS))
def test_each_cpu_gets_its_micro_kernels(name: str) -> None:
    text, arch, width, gemm = CPUS[name]
    cpu = cpu_model.parse_cpuinfo(text)
    assert cpu_model.microarchitecture(cpu) == arch
    assert cpu_model.avx512_width(cpu) == width
    plan = cpu_model.plan(cpu)
    assert (plan.cpu, plan.gemm, plan.winograd) == (arch, gemm, gemm)


def test_the_override_picks_what_the_cpu_has() -> None:
    genoa = cpu_model.parse_cpuinfo(CPUS["EPYC 9654 (Genoa)"][0])
    milan = cpu_model.parse_cpuinfo(CPUS["EPYC 7B13 (Milan)"][0])
    assert cpu_model.plan(genoa, "avx512").gemm == "avx512"
    assert cpu_model.plan(genoa, "avx2").winograd == "avx2"
    fallback = cpu_model.plan(milan, "avx512")
    assert fallback.gemm == "avx2" and "not on this CPU" in fallback.why
    with pytest.raises(ValueError, match="CANDLE_NN_CPU_ISA"):
        cpu_model.plan(genoa, "sse2")


def test_parse_keeps_the_first_processor_and_survives_odd_text() -> None:
    cpu = cpu_model.parse_cpuinfo(CPUS["EPYC 9755 (Turin)"][0] + "vendor_id\t: GenuineIntel\n")
    assert (cpu.vendor, cpu.family, cpu.model) == ("AuthenticAMD", 26, 2)
    empty = cpu_model.parse_cpuinfo("garbage without colons\n")
    assert cpu_model.plan(empty).gemm == "none" and cpu_model.microarchitecture(empty) == "other"


class _Clock:
    """A fake ``perf_counter``: each candidate's call advances it by that candidate's cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def call(self, costs: list[float]):
        def run() -> None:
            self.now += costs.pop(0) if len(costs) > 1 else costs[0]
        return run


@pytest.mark.parametrize("avx512, avx2, expect", [
    ([1.0], [0.5], "avx2"),            # clearly faster: switch
    ([1.0], [0.95], "avx512"),         # within the margin: keep the first
    ([0.5], [1.0], "avx512"),
    ([9.0, 9.0, 1.0], [0.8], "avx2"),  # slowed passes do not decide: the minimum does
    ([1.0], [9.0, 9.0, 0.8], "avx2"),
])
def test_first_use_timing_keeps_the_first_unless_clearly_beaten(avx512, avx2, expect) -> None:
    clock = _Clock()
    choice, best = cpu_model.faster({"avx512": clock.call(list(avx512)),
                                     "avx2": clock.call(list(avx2))}, rounds=5, clock=clock)
    assert choice == expect
    assert best == pytest.approx({"avx512": min(avx512), "avx2": min(avx2)})


@pytest.mark.skipif(not kernels.loaded(), reason="sets the compiled kernels' switches")
def test_the_plan_is_what_the_kernels_run_and_what_info_says() -> None:
    plan = kernels.plan()
    assert plan.gemm in ("avx512", "avx2", "none") and plan.winograd in ("avx512", "avx2", "none")
    if plan.gemm != "none":
        assert kernels.module().packed_gemm_isa() == plan.gemm
    info = cn.info()["cpu"]
    assert (info["gemm"], info["winograd"]) == (plan.gemm, plan.winograd)
    assert f"micro-kernels: GEMM {plan.gemm}" in str(cn.info())
    try:  # an injected plan sets the switches; this CPU's own is restored after
        assert kernels.apply_plan(cpu_model.Plan("x", "avx2", "avx2", "test")).gemm == "avx2"
        if plan.gemm != "none":
            assert kernels.module().packed_gemm_isa() == "avx2"
            # the first-use timing (Zen 4's plan) runs both kernels this CPU has, keeps one
            measured = kernels.apply_plan(cpu_model.Plan("x", "measure", "measure", "test"))
            assert {measured.gemm, measured.winograd} <= {"avx512", "avx2"}
            assert kernels.module().packed_gemm_isa() == measured.gemm
            assert "gemm avx" in measured.why and "winograd avx" in measured.why
    finally:
        kernels.apply_plan(plan)
    assert kernels.module().packed_gemm_isa() in (plan.gemm, "none")
