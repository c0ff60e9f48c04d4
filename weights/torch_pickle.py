"""Reading PyTorch checkpoints (pickles) for the converters — never called by the library itself.

Unpickling runs code named by the file, so it is an explicit, opt-in act of
``candle-nn-weights convert``. Two readers:

* :func:`load_state_dict` — plain ``state_dict`` files (torchvision, timm, MobileSAM), through
  ``torch.load(weights_only=True)`` (PyTorch's own restricted unpickler: tensors and containers).
* :func:`load_ultralytics` — ultralytics ``.pt`` files, which pickle whole ``DetectionModel``
  objects. A restricted unpickler maps every ``ultralytics.*`` and ``torch.nn.modules.*`` class to
  an inert stand-in (a plain object that only stores its pickled state: no ultralytics install, no
  code from the file runs), rebuilds tensors with PyTorch's own functions, and refuses any other
  global with a CandleNNError.
"""

from __future__ import annotations

import _compat_pickle
import os
import pickle
import re
import types
import warnings
from collections import OrderedDict
from typing import Any, Iterator

import numpy as np

from candle_nn import CandleNNError


class ConversionError(CandleNNError):
    """A checkpoint cannot be read or converted (missing torch, bad file, unexpected contents)."""


def require_torch() -> Any:
    """``import torch`` or a ConversionError that says how to install it."""
    try:
        import torch
    except ImportError:
        raise ConversionError(
            "reading PyTorch checkpoints needs torch: pip install 'candle-nn-mlx[convert]' "
            "(or convert from a .safetensors file, which needs no torch)") from None
    return torch


def _check_file(path: "str | os.PathLike") -> str:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ConversionError(f"checkpoint not found: {path}")
    if os.path.isdir(path):
        raise ConversionError(f"checkpoint path is a directory, not a file: {path}")
    return path


# -- inert stand-ins ------------------------------------------------------------------------------
class StandIn:
    """An object of a pickled class we do not import: it only keeps its pickled state.

    ``qualname`` (class attribute) is the original ``module.Class``; ``args`` what the pickle
    passed to the constructor; the instance ``__dict__`` holds the BUILD state (for an
    ``nn.Module``: ``_parameters``, ``_buffers``, ``_modules``, plain attributes).
    """

    qualname = "StandIn"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["state"] = state

    # dict/list subclasses are rebuilt with SETITEMS/APPENDS: keep the items as plain state.
    def __setitem__(self, key: Any, value: Any) -> None:
        self.__dict__.setdefault("items", {})[key] = value

    def append(self, value: Any) -> None:
        self.__dict__.setdefault("list", []).append(value)

    def extend(self, values: Any) -> None:
        for v in values:
            self.append(v)

    def __repr__(self) -> str:
        return f"<stand-in {self.qualname}>"


_STAND_IN_MODULES = ("ultralytics.", "torch.nn.modules.", "pathlib")
_STAND_INS: dict[str, type] = {}


def _stand_in(module: str, name: str) -> type:
    qualname = f"{module}.{name}"
    if qualname not in _STAND_INS:
        _STAND_INS[qualname] = type(name, (StandIn,), {"qualname": qualname})
    return _STAND_INS[qualname]


def _real_globals() -> dict[tuple[str, str], Any]:
    """The only real callables an ultralytics checkpoint may name (tensor rebuilding, containers,
    numpy scalars of the training metrics)."""
    import codecs
    import copyreg

    import torch
    import torch._utils

    found: dict[tuple[str, str], Any] = {
        ("collections", "OrderedDict"): OrderedDict,
        ("builtins", "set"): set,
        ("builtins", "frozenset"): frozenset,
        ("builtins", "object"): object,
        ("copyreg", "_reconstructor"): copyreg._reconstructor,
        ("_codecs", "encode"): codecs.encode,  # how protocol 2 spells bytes
        ("torch", "Size"): torch.Size,
        ("torch", "device"): torch.device,
        ("torch", "Tensor"): torch.Tensor,
        ("torch.nn.parameter", "Parameter"): torch.nn.Parameter,
        ("numpy", "dtype"): np.dtype,
    }
    for name in ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_parameter",
                 "_rebuild_parameter_with_state"):
        if hasattr(torch._utils, name):
            found[("torch._utils", name)] = getattr(torch._utils, name)
    if hasattr(torch._tensor, "_rebuild_from_type_v2"):
        found[("torch._tensor", "_rebuild_from_type_v2")] = torch._tensor._rebuild_from_type_v2
    for dtype_name in ("float16", "float32", "float64", "bfloat16", "int64", "int32", "uint8",
                       "bool"):
        found[("torch", dtype_name)] = getattr(torch, dtype_name)
    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct, scalar
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        found[(mod, "scalar")] = scalar
        found[(mod, "_reconstruct")] = _reconstruct
    found[("numpy", "ndarray")] = np.ndarray
    return found


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler for ultralytics checkpoints: stand-ins for model classes, refusal otherwise."""

    _globals: dict[tuple[str, str], Any] | None = None

    def find_class(self, module: str, name: str) -> Any:
        # Protocol-2 pickles (torch.save's default) name Python 2 modules: map them back.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if RestrictedUnpickler._globals is None:
            RestrictedUnpickler._globals = _real_globals()
        real = RestrictedUnpickler._globals.get((module, name))
        if real is not None:
            return real
        if module.startswith(_STAND_IN_MODULES) and name.isidentifier():
            return _stand_in(module, name)
        raise ConversionError(
            f"refusing to unpickle {module}.{name}: the checkpoint holds an object that is not "
            "part of an ultralytics model (only ultralytics/torch.nn classes, tensors and "
            "containers are read)")


def _pickle_module() -> types.ModuleType:
    """A module-like object for ``torch.load(pickle_module=...)``."""
    mod = types.ModuleType("candle_nn_restricted_pickle")
    mod.Unpickler = RestrictedUnpickler  # type: ignore[attr-defined]
    mod.load = lambda f, **kw: RestrictedUnpickler(f, **kw).load()  # type: ignore[attr-defined]
    mod.__name__ = "candle_nn_restricted_pickle"
    return mod


def _torch_load(path: str, **kwargs: Any) -> Any:
    torch = require_torch()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's protocol / FutureWarnings: not the user's
            return torch.load(path, map_location="cpu", **kwargs)
    except ConversionError:
        raise
    except Exception as exc:  # corrupt zip, truncated pickle, refused globals, …
        raise ConversionError(
            f"cannot read {path} as a PyTorch checkpoint: {_reason(exc)}") from exc


def _reason(exc: Exception) -> str:
    """A one-line cause from torch.load's (often paragraph-long) exception message."""
    text = str(exc)
    refused = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if refused:
        return (f"it holds a {refused.group(1)} object, not only tensors (torch's weights-only "
                "reader refused it); an ultralytics model is converted with --from ultralytics")
    if isinstance(exc, EOFError) or "Ran out of input" in text:
        return "the file is empty or truncated"
    first = re.split(r"(?<=[.;])\s", text.strip().splitlines()[0] if text.strip() else "")[0]
    return f"{type(exc).__name__}: {first[:200] or 'no details'}"


def load_ultralytics(path: "str | os.PathLike") -> Any:
    """Unpickle an ultralytics ``.pt`` file with :class:`RestrictedUnpickler` (opt-in)."""
    path = _check_file(path)
    return _torch_load(path, weights_only=False, pickle_module=_pickle_module())


def load_state_dict(path: "str | os.PathLike") -> dict[str, Any]:
    """A ``name -> tensor`` dict from a ``.safetensors`` file or a PyTorch ``state_dict`` pickle
    (``torch.load(weights_only=True)``). Containers such as ``{"state_dict": …}`` or
    ``{"model": …}`` are unwrapped."""
    path = _check_file(path)
    if path.endswith(".safetensors"):
        from candle_nn.var_builder import open_safetensors

        handle = open_safetensors(path)
        return {k: handle.get_tensor(k) for k in handle.keys()}
    return unwrap_state_dict(_torch_load(path, weights_only=True), path)


# The model's own weights first (as timm's load_checkpoint does), EMA copies only when alone.
_CONTAINER_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "params",
                   "state_dict_ema", "model_ema", "ema")


def unwrap_state_dict(data: Any, where: str) -> dict[str, Any]:
    """The tensor dict inside a checkpoint (itself, or under a usual container key)."""
    for _ in range(3):
        if isinstance(data, dict) and data and all(_is_tensor(v) for v in data.values()):
            return dict(data)
        if not isinstance(data, dict):
            break
        inner = next((data[k] for k in _CONTAINER_KEYS if isinstance(data.get(k), dict)), None)
        if inner is None:
            tensors = {k: v for k, v in data.items() if _is_tensor(v)}
            if tensors:
                return tensors
            break
        data = inner
    raise ConversionError(
        f"{where} holds no state_dict (a mapping of names to tensors); found "
        f"{type(data).__name__}" + (f" with keys {', '.join(map(str, list(data)[:8]))}"
                                    if isinstance(data, dict) else ""))


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def module_state_dict(module: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` of a stand-in ``nn.Module`` tree, as ``module.state_dict()`` would list
    them (parameters, then persistent buffers, then children)."""
    state = getattr(module, "__dict__", {})
    for name, value in (state.get("_parameters") or {}).items():
        if value is not None:
            yield prefix + name, value
    skip = set(state.get("_non_persistent_buffers_set") or ())
    for name, value in (state.get("_buffers") or {}).items():
        if value is not None and name not in skip:
            yield prefix + name, value
    for name, child in (state.get("_modules") or {}).items():
        if child is not None:
            yield from module_state_dict(child, f"{prefix}{name}.")


def to_numpy(value: Any) -> np.ndarray:
    """A torch tensor / MLX array / numpy array as numpy (bfloat16 becomes float32)."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):  # torch
        import torch

        t = value.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.contiguous().numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError, RuntimeError):  # MLX bfloat16
        import mlx.core as mx

        return np.asarray(value.astype(mx.float32))
