"""Module: an ``mlx.nn.Module`` that knows its device and runs every op there.

Subclasses implement :meth:`Module.forward`; calling the module enters its device's stream, so a
model built for the CPU runs on the CPU whatever MLX's default device is at call time. Assigning a
child module of another device raises :class:`DeviceMismatchError` at construction time, so a
model can never silently straddle two devices. Stateless modules (pooling, activations) may have
``device=None``: they run on the stream of whatever module calls them.

Threads: once a module is built (its outermost constructor has returned) its arrays are evaluated
in the building thread, and each call runs on the calling thread's stream of the module's device
(:attr:`Device.stream`), so a model can be called from any thread, several at a time. MLX's rule
still applies to what you hand it: evaluate inputs (``mx.eval(x)``) and changed parameters before
another thread uses them.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .device import Device
from .errors import DeviceMismatchError, ModuleInitError


def check_same_device(op: str, first: Device | None, second: Device | None,
                      first_name: str = "first operand",
                      second_name: str = "second operand") -> None:
    """Raise DeviceMismatchError unless the two devices agree (``None`` agrees with anything)."""
    if first is not None and second is not None and first != second:
        raise DeviceMismatchError(
            f"{op}: {first_name} is on {first} but {second_name} is on {second}. "
            f"Move one with `.to(Device.parse('{first}'))`, or build both from one VarBuilder "
            "on a single device."
        )


def _device_of(value: Any) -> Device | None:
    if isinstance(value, Module):
        return value.device
    if isinstance(value, (list, tuple)):
        devices = {d for d in (_device_of(v) for v in value) if d is not None}
        if len(devices) > 1:
            a, b = sorted(devices, key=str)[:2]
            check_same_device("list of modules", a, b)
        return next(iter(devices), None)
    if isinstance(value, dict) and not isinstance(value, nn.Module):
        return _device_of(list(value.values()))
    return None


_building = threading.local()
_SET_BY_INIT = ("_device", "_weights_prefix")  # what Module.__init__ sets on every module


class _EvaluatedWhenBuilt(type(nn.Module)):  # type: ignore[misc]
    """Evaluates a module's arrays when its outermost constructor returns: a pending MLX
    computation can only run in the thread that created it, so weights left lazy by the building
    thread (casts, layout transposes) would fail in any other thread."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(_building, "depth", 0)
        _building.depth = depth + 1
        try:
            module = super().__call__(*args, **kwargs)
        finally:
            _building.depth = depth
        if depth == 0:
            mx.eval([v for _, v in tree_flatten(module) if isinstance(v, mx.array)])
        return module


class Module(nn.Module, metaclass=_EvaluatedWhenBuilt):
    """Base class of candle_nn layers and models.

    Args:
        device: the device this module's weights live on and its forward runs on (a
            :class:`Device` or a name for :meth:`Device.parse`: ``"cpu"``, ``"gpu:0"``);
            ``None`` for stateless modules, which run on their caller's stream.
    """

    def __init__(self, device: "Device | str | None" = None) -> None:
        if isinstance(device, str):
            device = Device.parse(device)
        object.__setattr__(self, "_device", device)
        object.__setattr__(self, "_weights_prefix", None)
        super().__init__()

    def __getattr__(self, key: str) -> Any:
        if key in _SET_BY_INIT and key not in self.__dict__:  # Module.__init__ never ran
            name = type(self).__name__
            raise ModuleInitError(
                f"{name} was not initialised as a candle_nn Module: {name}.__init__ must call "
                "super().__init__(device) (None for a stateless module) before setting "
                "attributes or being called")
        return super().__getattr__(key)

    @property
    def device(self) -> Device | None:
        return self._device

    @property
    def weights_prefix(self) -> str | None:
        """The VarBuilder prefix this module's tensors were read under (set by the layers'
        ``load``), which ``candle_nn.save_safetensors`` writes them back under; ``None``: unknown
        (its parent's prefix and attribute path are used)."""
        return self._weights_prefix

    def loaded_from(self, vb: Any) -> "Module":
        """Record that this module's tensors came from ``vb`` (its prefix; a VarMap-backed ``vb``
        also remembers the module, see ``VarMap.save``). Returns ``self``."""
        object.__setattr__(self, "_weights_prefix", vb.prefix)
        vb.track(self)
        return self

    def __setattr__(self, key: str, value: Any) -> None:
        if not key.startswith("_"):
            child = _device_of(value)
            if child is not None:
                name = type(self).__name__
                if self._device is not None:
                    check_same_device(f"{name}.{key}", self._device, child, name, f"child '{key}'")
                else:  # a stateless container still may not straddle two devices
                    for other, value_other in self.items():
                        if other != key:
                            check_same_device(f"{name}.{key}", _device_of(value_other), child,
                                              f"child '{other}'", f"child '{key}'")
        super().__setattr__(key, value)

    #: parameters that are state, never learned (BatchNorm's running statistics): frozen at
    #: construction and kept frozen by :meth:`unfreeze` on this module or any ancestor
    _always_frozen: tuple[str, ...] = ()

    def unfreeze(self, *args: Any, **kwargs: Any) -> "Module":
        """MLX's ``unfreeze``, except that state such as BatchNorm's running statistics stays
        frozen (out of ``trainable_parameters()``, so no optimizer ever touches it)."""
        super().unfreeze(*args, **kwargs)
        for _, module in self.named_modules():
            keys = [k for k in getattr(module, "_always_frozen", ()) if k in module]
            if keys:
                nn.Module.freeze(module, keys=keys, recurse=False)
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.__dict__.get("_compile") and not kwargs:
            return self._compiled_forward()(*args)
        with self.on_device():
            return self.forward(*args, **kwargs)

    def set_compiled(self, enabled: bool | None = None) -> "Module":
        """Run calls of this module under ``mx.compile`` (or not); returns self.

        The compiled path is the fast one for inference on GPUs: elementwise chains (bias, SiLU,
        residual adds) fuse into single kernels and each forward launches fewer of them (ResNet-50
        float16 on an H100: 109 kernels instead of 178). ``enabled=None`` compiles on GPUs only:
        on the CPU, MLX builds C++ on the first call of each input shape and runs slower. Weights
        are traced as constants, so compile after loading and switch it off (``False``) to train
        or change them; :meth:`to` switches it off. Each thread traces its own compiled forward
        (on its own stream); calls with keyword arguments run uncompiled.
        """
        if enabled is None:
            enabled = self._device is not None and self._device.kind == "gpu"
        object.__setattr__(self, "_compile", bool(enabled))
        object.__setattr__(self, "_compiled", threading.local())
        return self

    @property
    def compiled(self) -> bool:
        """Whether calls run under ``mx.compile`` (see :meth:`set_compiled`)."""
        return bool(self.__dict__.get("_compile"))

    def _compiled_forward(self) -> Callable[..., Any]:
        local = self.__dict__["_compiled"]
        fn = getattr(local, "forward", None)
        if fn is None:
            def eager(*args: Any) -> Any:
                with self.on_device():
                    return self.forward(*args)

            fn = local.forward = mx.compile(eager)
        return fn

    def on_device(self) -> contextlib.AbstractContextManager:
        """Context manager running MLX ops on this module's stream (a no-op when stateless)."""
        if self._device is None:
            return contextlib.nullcontext()
        return mx.stream(self._device.stream)

    def to(self, device: "Device | str") -> "Module":
        """Move this module and every candle_nn child to ``device`` (in place; returns self)."""
        device = Device.parse(device)
        mx.eval(self.parameters())  # finish pending work on the old stream
        object.__setattr__(self, "_compile", False)  # traced on the old device's streams
        for _, module in self.named_modules():
            if isinstance(module, Module) and module._device is not None:
                object.__setattr__(module, "_device", device)
        return self

    def num_parameters(self) -> int:
        """Total number of parameter elements."""
        from mlx.utils import tree_flatten

        return sum(v.size for _, v in tree_flatten(self.parameters()))


class Sequential(Module):
    """Calls its layers in order: ``Sequential(conv, relu, pool)(x)``.

    Layers may be candle_nn modules or plain callables (``candle_nn.relu``); all device-bound
    layers must share one device, which becomes the Sequential's.
    """

    def __init__(self, *layers: "Module | Callable[[mx.array], mx.array]") -> None:
        devices = [(i, layer.device) for i, layer in enumerate(layers)
                   if isinstance(layer, Module) and layer.device]
        device = devices[0][1] if devices else None
        for i, d in devices[1:]:
            check_same_device("Sequential", device, d, f"layer {devices[0][0]}", f"layer {i}")
        super().__init__(device)
        self.layers = list(layers)

    def forward(self, x: mx.array) -> mx.array:
        for layer in self.layers:
            x = layer(x)
        return x

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, str):
            return super().__getitem__(index)
        return self.layers[index]

    def append(self, layer: "Module | Callable[[mx.array], mx.array]") -> "Sequential":
        """Add a layer at the end (same device rule as the constructor)."""
        if isinstance(layer, Module):
            check_same_device("Sequential.append", self._device, layer.device,
                              "the Sequential", "the new layer")
            if self._device is None and layer.device is not None:
                object.__setattr__(self, "_device", layer.device)
        self.layers = self.layers + [layer]
        return self


def seq(layers: Iterable["Module | Callable[[mx.array], mx.array]"] = ()) -> Sequential:
    """candle's ``seq()``: a Sequential from an iterable of layers."""
    return Sequential(*layers)
