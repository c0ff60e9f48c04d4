"""Devices: the one place a model's weights and ops live.

A :class:`Device` names an MLX device (``cpu`` or ``gpu:N``) and owns the MLX stream its work runs
on. Requests for the same device return the *same* object (``Device.cpu() is Device.parse("cpu")``)
and equality is by kind and index, so devices can be compared and used as dict keys.

Threads: a Device is shared by every thread, and its :attr:`Device.stream` is per thread (MLX
streams belong to the thread that made them), so a model built in one thread can be called from any
other, or from several at once. A model's arrays are evaluated when it has been built (see
:class:`~candle_nn.module.Module`); inputs handed to another thread must be evaluated too
(``mx.eval(x)``), because a pending MLX computation can only run in the thread that created it.

On Apple silicon ``gpu`` is Metal; on Linux with ``mlx[cuda]`` it is CUDA; with ``mlx[cpu]`` there
is no GPU and asking for one raises :class:`~candle_nn.errors.DeviceUnavailableError`.
"""

from __future__ import annotations

import threading
from typing import ClassVar

import mlx.core as mx

from .errors import DeviceUnavailableError

_KINDS = {"cpu": mx.cpu, "gpu": mx.gpu}
_ALIASES = {"cuda": "gpu", "metal": "gpu", "mps": "gpu"}


def _gpu_count() -> int:
    return int(mx.device_count(mx.gpu)) if mx.is_available(mx.gpu) else 0


def _checked(kind: str, index: object) -> tuple[str, int]:
    """``(kind, index)`` with ``kind``'s alias resolved; DeviceUnavailableError when no device
    could ever be called that."""
    kind = _ALIASES.get(kind, kind)
    if kind not in _KINDS:
        raise DeviceUnavailableError(f"unknown device kind {kind!r}: use 'cpu', 'gpu' or 'gpu:N'")
    if not isinstance(index, int) or index < 0 or (kind == "cpu" and index != 0):
        raise DeviceUnavailableError(f"invalid device index {index!r} for {kind}")
    return kind, index


def parse_device_name(spec: str) -> tuple[str, int]:
    """``"cpu"``, ``"gpu"``, ``"gpu:1"`` (any case; ``cuda``/``metal``/``mps`` are aliases of
    ``gpu``) as ``(kind, index)``, checking the spelling only, not that this machine has that
    device (:meth:`Device.parse` does both). Bad spellings raise DeviceUnavailableError."""
    if not isinstance(spec, str):
        raise DeviceUnavailableError(f"cannot parse device from {spec!r}")
    kind, colon, idx = spec.strip().lower().partition(":")
    if colon and not idx.isdigit():  # "gpu:" and "gpu:x" are typos, not "gpu:0"
        raise DeviceUnavailableError(f"bad device {spec!r}: expected 'cpu', 'gpu' or 'gpu:N'")
    return _checked(kind, int(idx) if idx else 0)


class Device:
    """An MLX device and its streams (one per thread: see :attr:`stream`).

    Thread-safe: one Device object serves every thread, and models of this device can be called
    from any thread, several at once.

    Create devices with :meth:`cpu`, :meth:`gpu`, :meth:`parse` or :meth:`default`; the
    constructor is the same as :meth:`parse`'s parts and is interned.

    Attributes:
        kind: ``"cpu"`` or ``"gpu"``.
        index: device index (0 for the CPU).
    """

    _interned: ClassVar[dict[tuple[str, int], "Device"]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()
    __slots__ = ("kind", "index", "_streams")

    def __new__(cls, kind: str, index: int = 0) -> "Device":
        kind, index = _checked(kind, index)
        with cls._lock:
            found = cls._interned.get((kind, index))
            if found is not None:
                return found
            if kind == "gpu":
                count = _gpu_count()
                if index >= count:
                    have = "no GPU" if count == 0 else f"{count} GPU(s)"
                    raise DeviceUnavailableError(
                        f"gpu:{index} was requested but this MLX build has {have} "
                        f"(MLX {mx.__version__}). Use --device cpu / Device.cpu(), or install "
                        "an MLX with a GPU backend (Metal on macOS, `pip install mlx[cuda]` on "
                        "Linux)."
                    )
            self = object.__new__(cls)
            object.__setattr__(self, "kind", kind)
            object.__setattr__(self, "index", index)
            object.__setattr__(self, "_streams", threading.local())
            cls._interned[(kind, index)] = self
            return self

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Device is immutable")

    # -- constructors -----------------------------------------------------------------------
    @classmethod
    def cpu(cls) -> "Device":
        """The CPU."""
        return cls("cpu", 0)

    @classmethod
    def gpu(cls, index: int = 0) -> "Device":
        """GPU ``index``; raises DeviceUnavailableError when there is none."""
        return cls("gpu", index)

    @classmethod
    def parse(cls, spec: "str | Device") -> "Device":
        """Parse ``"cpu"``, ``"gpu"``, ``"gpu:1"`` (``cuda``/``metal`` are aliases of ``gpu``)."""
        if isinstance(spec, Device):
            return spec
        return cls(*parse_device_name(spec))

    @classmethod
    def default(cls) -> "Device":
        """GPU 0 when MLX has a GPU backend, else the CPU."""
        return cls.gpu(0) if _gpu_count() > 0 else cls.cpu()

    @classmethod
    def available(cls) -> list["Device"]:
        """Every device this machine has: the CPU, then each GPU."""
        return [cls.cpu()] + [cls.gpu(i) for i in range(_gpu_count())]

    # -- MLX handles --------------------------------------------------------------------------
    @property
    def mx_device(self) -> mx.Device:
        """The corresponding ``mlx.core.Device``."""
        return mx.Device(_KINDS[self.kind], self.index)

    @property
    def stream(self) -> mx.Stream:
        """The calling thread's MLX stream for this device: every op of this device's modules
        runs on it. An MLX stream works only in the thread that made it, so there is one per
        (thread, device), made on the thread's first use and the same object afterwards: the
        main thread's is the device's default stream, every other thread gets a new one."""
        stream = getattr(self._streams, "stream", None)
        if stream is None:
            if threading.current_thread() is threading.main_thread():
                stream = mx.default_stream(self.mx_device)
            else:
                stream = mx.new_stream(self.mx_device)
            self._streams.stream = stream
        return stream

    # -- value semantics ----------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Device):
            return NotImplemented
        return (self.kind, self.index) == (other.kind, other.index)

    def __hash__(self) -> int:
        return hash((self.kind, self.index))

    def __repr__(self) -> str:
        return f"Device({str(self)!r})"

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"gpu:{self.index}"

    def __reduce__(self):  # pickling/copying yields the interned object
        return (Device, (self.kind, self.index))


def as_device(device: "Device | str | None") -> Device:
    """``None`` → :meth:`Device.default`, a string → :meth:`Device.parse`, a Device as is."""
    if device is None:
        return Device.default()
    return Device.parse(device)
