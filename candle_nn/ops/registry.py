"""The op registry: each op is a function whose body is the plain-MLX reference; backends
register faster implementations of it (``candle_nn/backends/<backend>/``).

An :class:`Op` call tries its enabled implementations in order: the first whose ``applies(...)``
is true runs, and a ``None`` result from it means "not here after all" (the next one is tried);
when none runs, the reference does. ``disable(name)`` / ``enable(name)`` / ``with disabled(...)``
switch implementations off by their name (``"winograd"``), their backend (``"cpu"``: all of
them) or their op (``"conv2d"``: all of its implementations). :func:`status` lists every
implementation with its switch, whether it can run here, the MLX limitation it works around
and its behaviour under ``mx.grad``.

Gradients: an implementation declares ``grad``:

- ``"reference"``: it has no VJP of its own (the C++ primitives). The dispatcher routes a call
  with a tracer among its array arguments (under ``mx.grad`` / ``mx.vjp`` / ``mx.vmap`` /
  ``mx.compile``'s trace) to the reference, so the transformation sees plain MLX ops and
  differentiates them as MLX does.
- ``"own"``: it is differentiable itself and is not routed: the CUDA kernels
  (``mx.fast.cuda_kernel``), which must keep running under ``mx.compile`` (the CLIs compile on
  GPUs), carry the VJP of the same math in MLX ops (``candle_nn.custom_vjp.with_reference_vjp``);
  a kernel with a hand-written VJP declares the same.
- ``"mlx"``: it is built from MLX ops (or ops that dispatch themselves); MLX differentiates it as
  it is.
- ``"none"``: no VJP and not routed (none registered today): under ``mx.grad`` MLX reports the
  missing VJP.

Why routing rather than wrapping every kernel in ``mx.custom_function``: inference (the common
case) pays nothing for it, the reference is the one definition of the math the gradient is
checked against, and a kernel that must run inside traced code declares ``grad="own"``.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import mlx.core as mx

MLX_VERSION = "0.32.4"  # the MLX whose limitations the registered implementations work around
GRADS = ("reference", "mlx", "own", "none")


@dataclass(frozen=True)
class Impl:
    """One backend implementation of an op.

    Attributes:
        op: the op's name. name: the implementation's switch name (may be shared by the
            implementations of one kernel for several ops, e.g. ``packed_gemm``).
        backend: ``"cpu"`` or ``"cuda"``. fn: takes the op's arguments; returns the result or
            ``None`` (then the next implementation, else the reference, runs).
        applies: takes the op's arguments; cheap checks (device, dtype, shapes).
        works_around: the MLX limitation this exists for (what to re-check before removing it).
        mlx: the MLX version that limitation was measured in.
        grad: ``"reference"``, ``"mlx"``, ``"own"`` or ``"none"`` (module docstring).
        available: whether it can run in this process at all (kernels built, CPU features).
    """

    op: str
    name: str
    backend: str
    fn: Callable[..., Any]
    applies: Callable[..., bool]
    works_around: str
    mlx: str = MLX_VERSION
    grad: str = "reference"
    available: Callable[[], bool] = lambda: True


_OPS: dict[str, "Op"] = {}
_disabled: set[str] = set()
_is_tracer: Callable[[mx.array], bool] | None = None


def set_tracer_check(fn: Callable[[mx.array], bool]) -> None:
    """Install the test for tracer arrays (the compiled CPU module's ``is_tracer``)."""
    global _is_tracer
    _is_tracer = fn


def is_tracer(x: mx.array) -> bool:
    """Whether ``x`` is a tracer of a transformation (``mx.compile``'s trace, ``mx.vmap``,
    ``mx.grad``): it may have no values to read. False where no check is installed."""
    return _is_tracer is not None and _is_tracer(x)


def _traced(args: tuple, kwargs: dict) -> bool:
    check = _is_tracer
    if check is None:
        return False
    for a in (*args, *kwargs.values()):
        if isinstance(a, mx.array) and check(a):
            return True
    return False


class Op:
    """A registered op: call it like its reference function."""

    def __init__(self, reference: Callable[..., Any], name: str) -> None:
        functools.update_wrapper(self, reference)
        self.name = name
        self.reference = reference
        self.impls: list[Impl] = []
        self._active: tuple[Impl, ...] = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for impl in self._active:
            if impl.applies(*args, **kwargs):
                if impl.grad == "reference" and _traced(args, kwargs):
                    continue
                out = impl.fn(*args, **kwargs)
                if out is not None:
                    return out
        return self.reference(*args, **kwargs)

    def add(self, impl: Impl) -> None:
        """Append ``impl`` (tried after those already there); :func:`register` calls it."""
        if any(i.name == impl.name and i.backend == impl.backend for i in self.impls):
            raise ValueError(f"{self.name} has a {impl.backend} implementation {impl.name!r} "
                             "already")
        self.impls.append(impl)
        self._refresh()

    def _refresh(self) -> None:
        self._active = tuple(i for i in self.impls if _on(i) and i.available())

    def __repr__(self) -> str:
        return f"<candle_nn op {self.name}: {[i.name for i in self.impls]}>"


def _on(impl: Impl) -> bool:
    return not (_keys(impl) & _disabled)


def _keys(impl: Impl) -> set[str]:
    """The names that switch ``impl``: its name, backend, op, ``op.name`` and ``backend:name``."""
    return {impl.name, impl.backend, impl.op, f"{impl.op}.{impl.name}",
            f"{impl.backend}:{impl.name}"}


def op(name: str) -> Callable[[Callable[..., Any]], Op]:
    """Decorator: the function (its body the plain-MLX reference) becomes the op ``name``."""
    def wrap(reference: Callable[..., Any]) -> Op:
        if name in _OPS:
            raise ValueError(f"op {name!r} is registered twice")
        _OPS[name] = Op(reference, name)
        return _OPS[name]
    return wrap


def register(op_name: str, name: str, backend: str, *, applies: Callable[..., bool],
             works_around: str, grad: str = "reference", mlx: str = MLX_VERSION,
             available: Callable[[], bool] = lambda: True) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn`` as implementation ``name`` of op ``op_name`` (tried in the
    order of registration)."""
    if grad not in GRADS:
        raise ValueError(f"grad must be one of {GRADS}, not {grad!r}")

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        _OPS[op_name].add(Impl(op_name, name, backend, fn, applies, works_around, mlx, grad,
                                available))
        return fn
    return wrap


def _check(name: str) -> None:
    known = {n for o in _OPS.values() for i in o.impls for n in _keys(i)}
    if name not in known:
        raise KeyError(f"no op, implementation or backend named {name!r}; "
                       f"known: {sorted(known)}")


def refresh() -> None:
    """Re-evaluate which implementations can run (after e.g. the BLAS changed)."""
    for o in _OPS.values():
        o._refresh()


_refresh_all = refresh


def disable(*names: str) -> None:
    """Switch implementations off: by implementation name (``"winograd"``), backend (``"cpu"``),
    op (``"conv2d"``), ``"op.impl"`` or ``"backend:impl"``."""
    for name in names:
        _check(name)
    _disabled.update(names)
    _refresh_all()


def enable(*names: str) -> None:
    """Undo :func:`disable` for ``names``."""
    for name in names:
        _check(name)
    _disabled.difference_update(names)
    _refresh_all()


def is_enabled(name: str) -> bool:
    """Whether ``name`` (as in :func:`disable`) is switched on."""
    _check(name)
    return name not in _disabled


@contextlib.contextmanager
def disabled(*names: str) -> Iterator[None]:
    """``with disabled("winograd"): ...``: those implementations off inside the block."""
    for name in names:
        _check(name)
    before = set(_disabled)
    _disabled.update(names)
    _refresh_all()
    try:
        yield
    finally:
        _disabled.clear()
        _disabled.update(before)
        _refresh_all()


@contextlib.contextmanager
def only(*names: str, backend: str | None = None) -> Iterator[None]:
    """Every implementation off except ``names`` (of ``backend``, when given) inside the block."""
    for name in names:
        _check(name)
    keep = set(names)
    off = {f"{i.op}.{i.name}" for o in _OPS.values() for i in o.impls
           if (backend is None or i.backend == backend)
           and not ({i.name, i.op, f"{i.op}.{i.name}"} & keep)}
    with disabled(*off):
        yield


def ops() -> dict[str, Op]:
    """Every registered op by name."""
    return dict(_OPS)


def implementations() -> list[Impl]:
    """Every registered implementation, op by op in dispatch order."""
    return [i for o in _OPS.values() for i in o.impls]


def status() -> list[dict[str, object]]:
    """One row per implementation: op, name, backend, enabled, available, grad, mlx,
    works_around."""
    return [{"op": i.op, "name": i.name, "backend": i.backend, "enabled": _on(i),
             "available": bool(i.available()), "grad": i.grad, "mlx": i.mlx,
             "works_around": i.works_around} for i in implementations()]
