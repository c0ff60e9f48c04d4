"""Every ``CANDLE_NN_*`` environment variable, read here and nowhere else.

Each is read once, when candle_nn is imported (:data:`SETTINGS` lists them, docs/environment.md
documents them; a test fails on a read anywhere else). Code asks this module for the value
(:func:`get` or the typed helpers below). :func:`reload` re-reads the environment, for tests.

The import-order rule lives in ``_startup.py``: import candle_nn before mlx.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_OFF = ("0", "off", "false", "no")


@dataclass(frozen=True)
class Setting:
    """One environment variable: its name, default and a one-line description."""

    name: str
    default: str
    doc: str


SETTINGS: tuple[Setting, ...] = (
    Setting("CANDLE_NN_PRECISION", "exact",
            "float32 on CUDA: `exact` (sets MLX_ENABLE_TF32=0) or `tf32`"),
    Setting("CANDLE_NN_CUDA_LAUNCH", "candle",
            "`candle` (MLX_USE_CUDA_GRAPHS=0) or `mlx` (MLX's launch defaults)"),
    Setting("CANDLE_NN_BLAS", "auto",
            "the CPU BLAS bound to MLX: `auto`, `off`, or a library path / soname"),
    Setting("CANDLE_NN_CPU_FAST", "1", "`0`: every CPU fast path off (plain MLX ops)"),
    Setting("CANDLE_NN_CPU_GEMM", "auto", "`blas`: the packed-weight GEMM off"),
    Setting("CANDLE_NN_CPU_THREADS", "",
            "threads of the compiled CPU kernels when the BLAS cannot say"),
    Setting("CANDLE_NN_CPU_ISA", "auto",
            "the packed GEMM's and Winograd's micro-kernels: `auto` (per CPU), `avx512`, `avx2`"),
    Setting("CANDLE_NN_CPU_MALLOC", "reuse",
            "`reuse`: glibc keeps large freed blocks for reuse; `os`: its defaults"),
    Setting("CANDLE_NN_CUDA_KERNELS", "all",
            "`all`, `0` (none), or a comma list of CUDA kernels to keep for every dtype"),
    Setting("CANDLE_NN_FIXTURES", "", "the reference fixtures folder (tests, benchmarks)"),
    Setting("CANDLE_NN_PARITY_REPORT", "", "tests: a file the parity tests append errors to"),
    Setting("CANDLE_NN_REQUIRE_NATIVE", "", "tests: fail (not fall back) without the C++ kernels"),
    Setting("CANDLE_NN_APP_SCREENSHOTS", "",
            "tests: the folder the app's browser test saves its screenshots to"),
)
_NAMES = {s.name for s in SETTINGS}
_values: dict[str, str] = {}


def reload() -> None:
    """Read every setting from the environment (done at import; tests call it again)."""
    _values.clear()
    _values.update({s.name: os.environ.get(s.name, s.default).strip() for s in SETTINGS})


def get(name: str) -> str:
    """The value of setting ``name`` (its default when unset), stripped."""
    if name not in _NAMES:
        raise KeyError(f"{name} is not a candle_nn setting; see candle_nn.config.SETTINGS")
    return _values[name]


def is_set(name: str) -> bool:
    """Whether ``name`` was given a non-empty value."""
    return bool(get(name))


def flag(name: str) -> bool:
    """A boolean setting: false for ``0``/``off``/``false``/``no``."""
    return get(name).lower() not in _OFF


def cpu_isa() -> str:
    """``CANDLE_NN_CPU_ISA`` lower-cased (``auto`` when empty)."""
    return get("CANDLE_NN_CPU_ISA").lower() or "auto"


def cpu_threads() -> int | None:
    """``CANDLE_NN_CPU_THREADS`` as a positive int, or ``None``."""
    value = get("CANDLE_NN_CPU_THREADS")
    return int(value) if value.isdigit() and int(value) > 0 else None


def cuda_kernels() -> tuple[str, frozenset[str]]:
    """``CANDLE_NN_CUDA_KERNELS`` as ``("all" | "off" | "named", names)``."""
    value = get("CANDLE_NN_CUDA_KERNELS").lower()
    if value in ("1", "all", "on", "true", ""):
        return "all", frozenset()
    if value in _OFF:
        return "off", frozenset()
    return "named", frozenset(k.strip() for k in value.split(",") if k.strip())


def fixtures_dir(default: Path) -> Path:
    """``CANDLE_NN_FIXTURES`` as a path, else ``default``."""
    value = get("CANDLE_NN_FIXTURES")
    return Path(value) if value else default


reload()
