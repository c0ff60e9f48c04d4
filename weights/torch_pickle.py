"""Reading PyTorch checkpoints (pickles) for the converters — never called by the library itself.

Unpickling runs code named by the file, so it is an explicit, opt-in act of
``candle-nn-weights convert``, and torch never reads the file:
:mod:`candle_nn_models.weights.torch_archive` checks the container (refusing TorchScript archives
and anything but a plain ``torch.save`` file) and reads the storages; :class:`RestrictedUnpickler`
reads the pickle. Two readers:

* :func:`load_state_dict` — plain ``state_dict`` files (torchvision, timm, MobileSAM): tensors
  and containers only (any other global is refused).
* :func:`load_ultralytics` — ultralytics ``.pt`` files, which pickle whole ``DetectionModel``
  objects: every ``ultralytics.*`` and ``torch.nn.modules.*`` class becomes an inert stand-in (a
  plain object that only stores its pickled state: no ultralytics install, no code from the file
  runs).

Tensors come back as NumPy arrays (bfloat16 widened to float32) rebuilt by our own functions;
torch is not needed.
"""

from __future__ import annotations

import _compat_pickle
import os
import pickle
from collections import OrderedDict
from dataclasses import dataclass
from typing import IO, Any, Iterator

import numpy as np

from candle_nn import CandleNNError, check_weights_path, open_safetensors, read_tensor

from . import torch_archive
from .torch_archive import PersistentLoad, StorageType, storage_type


class ConversionError(CandleNNError):
    """A checkpoint cannot be read or converted (bad file, unexpected contents)."""


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


@dataclass(frozen=True)
class ClassAttribute:
    """What ``builtins.getattr(<ultralytics class>, "forward")`` becomes: the attribute's name,
    never looked up nor callable. ultralytics 8.0-8.3's Segment and Pose heads hold
    ``self.detect = Detect.forward``, which pickle protocol 2 (torch.save's) writes that way."""

    owner: str
    name: str


# The only attributes a checkpoint may read off a pickled ultralytics class.
CLASS_ATTRIBUTES = ("forward",)
FUSED_MODEL = (
    "a fused ultralytics model (model.fuse() merged each BatchNorm into its conv and replaced "
    "forward by forward_fuse); convert the training checkpoint (runs/…/weights/best.pt), "
    "which is not fused")


def _getattr(owner: Any, name: Any) -> ClassAttribute:
    """``builtins.getattr`` in an ultralytics pickle: :class:`ClassAttribute` for an attribute of
    :data:`CLASS_ATTRIBUTES` of a stand-in ultralytics class, ConversionError for anything else
    (a bound method of a fused model's layers is named as such)."""
    is_class = isinstance(owner, type) and issubclass(owner, StandIn)
    if is_class and owner.qualname.startswith("ultralytics.") and name in CLASS_ATTRIBUTES:
        return ClassAttribute(owner.qualname, name)
    if isinstance(owner, StandIn) and isinstance(name, str) and name.startswith("forward"):
        raise ConversionError(f"the checkpoint holds {FUSED_MODEL}")
    what = owner.qualname if is_class else type(owner).__name__
    raise ConversionError(
        f"refusing to read getattr({what}, {str(name)[:40]!r}) from the checkpoint: only "
        f"{', '.join(CLASS_ATTRIBUTES)} of an ultralytics class (ultralytics 8.0-8.3's heads) "
        "is read")


# torchvision.transforms: the Compose ultralytics' classification trainer stores in model.transforms
_STAND_IN_MODULES = ("ultralytics.", "torch.nn.modules.", "pathlib", "torchvision.transforms.")
_STAND_INS: dict[str, type] = {}


def _stand_in(module: str, name: str) -> type:
    qualname = f"{module}.{name}"
    if qualname not in _STAND_INS:
        _STAND_INS[qualname] = type(name, (StandIn,), {"qualname": qualname})
    return _STAND_INS[qualname]


def _device(*args: Any) -> str:
    return ":".join(str(a) for a in args)


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_: Any) -> np.ndarray:
    """torch's ``_rebuild_tensor[_v2]`` on a storage from
    :mod:`candle_nn_models.weights.torch_archive`: the strided view it describes (bfloat16 widened
    to float32), bounds-checked against the storage."""
    if not (isinstance(storage, tuple) and len(storage) == 2
            and isinstance(storage[0], StorageType) and isinstance(storage[1], np.ndarray)):
        raise ConversionError(f"a tensor's storage is a {type(storage).__name__}, not a storage")
    stype, flat = storage
    dims = [offset, *size, *stride] if isinstance(size, tuple) and isinstance(stride, tuple) \
        else None
    if dims is None or len(size) != len(stride) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        raise ConversionError(f"a tensor has a malformed shape {size!r} / stride {stride!r}")
    if 0 in size:
        view = np.zeros(size, flat.dtype)
    else:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= flat.size:
            raise ConversionError(
                f"a tensor of shape {tuple(size)} reaches element {last} of a storage of "
                f"{flat.size} (truncated or malformed file)")
        view = np.lib.stride_tricks.as_strided(
            flat[offset:], shape=size, strides=[s * flat.itemsize for s in stride],
            writeable=False)
    if stype.bfloat16:
        return (view.astype(np.uint32) << 16).view(np.float32)
    return view


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    return data


def _rebuild_from_type(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    return func(*args)


_TORCH_DTYPES = ("float16", "float32", "float64", "bfloat16", "int64", "int32", "int16", "int8",
                 "uint8", "bool", "half", "float", "double", "long", "int")


def _real_globals() -> dict[tuple[str, str], Any]:
    """The only callables a checkpoint may name: tensors are rebuilt as NumPy arrays by our own
    functions (never torch's), torch types become inert values, plus containers and the NumPy
    scalars of ultralytics' training metrics. None of them imports or runs anything else."""
    import codecs
    import copyreg

    found: dict[tuple[str, str], Any] = {
        ("collections", "OrderedDict"): OrderedDict,
        ("builtins", "set"): set,
        ("builtins", "frozenset"): frozenset,
        ("builtins", "object"): object,
        ("copyreg", "_reconstructor"): copyreg._reconstructor,
        ("_codecs", "encode"): codecs.encode,  # how protocol 2 spells bytes
        ("torch", "Size"): tuple,
        ("torch", "device"): _device,
        ("torch", "Tensor"): _stand_in("torch", "Tensor"),
        ("torch.nn.parameter", "Parameter"): _stand_in("torch.nn.parameter", "Parameter"),
        ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
        ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type,
        ("numpy", "dtype"): np.dtype,
        ("numpy", "ndarray"): np.ndarray,
    }
    for dtype_name in _TORCH_DTYPES:
        found[("torch", dtype_name)] = f"torch.{dtype_name}"
    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct, scalar
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        found[(mod, "scalar")] = scalar
        found[(mod, "_reconstruct")] = _reconstruct
    return found


_GLOBALS = _real_globals()


class RestrictedUnpickler(pickle.Unpickler):
    """The unpickler of every checkpoint: the globals of :func:`_real_globals`, torch's storage
    types, and — only when ``stand_ins`` (ultralytics files) — inert stand-ins for ultralytics
    and torch.nn classes. Any other global is refused with a ConversionError."""

    def __init__(self, file: IO[bytes], persistent_load: PersistentLoad, *,
                 stand_ins: bool) -> None:
        super().__init__(file)
        self._storage = persistent_load
        self._stand_ins = stand_ins

    def persistent_load(self, pid: Any) -> Any:
        return self._storage(pid)

    def find_class(self, module: str, name: str) -> Any:
        # Protocol-2 pickles (torch.save's default) name Python 2 modules: map them back.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        module = "torch._tensor" if module == "torch.tensor" else module  # torch < 1.8's name
        real = _GLOBALS.get((module, name))
        if real is not None:
            return real
        if module in ("torch", "torch.cuda") and (stype := storage_type(name)) is not None:
            return stype
        if self._stand_ins and (module, name) == ("builtins", "getattr"):
            return _getattr
        if self._stand_ins and module.startswith(_STAND_IN_MODULES) and name.isidentifier():
            return _stand_in(module, name)
        if self._stand_ins:
            raise ConversionError(
                f"refusing to unpickle {module}.{name}: the checkpoint holds an object that is "
                "not part of an ultralytics model (only ultralytics/torch.nn classes, tensors "
                "and containers are read)")
        raise ConversionError(
            f"refusing to unpickle {module}.{name}: a state_dict holds only tensors and "
            "containers" + ("; an ultralytics model is converted with --from ultralytics"
                            if module.startswith(_STAND_IN_MODULES) else ""))


def _unpickle(path: "str | os.PathLike", *, stand_ins: bool) -> Any:
    """The object in the torch.save file ``path``, read by :class:`RestrictedUnpickler`."""
    path = check_weights_path(path, what="checkpoint")
    try:
        return torch_archive.load(path, lambda f, storage: RestrictedUnpickler(
            f, storage, stand_ins=stand_ins))
    except CandleNNError:
        raise
    except Exception as exc:  # truncated pickle, bad opcode, deep nesting, …
        raise ConversionError(
            f"cannot read {path} as a PyTorch checkpoint: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    """A one-line cause from an unpickling failure."""
    if isinstance(exc, EOFError):
        return "the file is empty or truncated"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else "no details"
    return f"{type(exc).__name__}: {text[:200]}"


def load_ultralytics(path: "str | os.PathLike") -> Any:
    """Unpickle an ultralytics ``.pt`` file with :class:`RestrictedUnpickler` (opt-in)."""
    return _unpickle(path, stand_ins=True)


def load_state_dict(path: "str | os.PathLike", *, ema_first: bool = False,
                    taken: list[tuple[str, list[str]]] | None = None) -> dict[str, Any]:
    """A ``name -> tensor`` dict from a ``.safetensors`` file or a PyTorch ``state_dict`` pickle
    (tensors and containers only). Containers such as ``{"state_dict": …}`` or ``{"model": …}``
    are unwrapped (see :func:`unwrap_state_dict` for ``ema_first`` and ``taken``)."""
    path = check_weights_path(path, what="checkpoint")
    if path.endswith(".safetensors"):
        handle = open_safetensors(path)
        return {k: read_tensor(handle, path, k) for k in handle.keys()}
    return unwrap_state_dict(_unpickle(path, stand_ins=False), path, ema_first=ema_first,
                             taken=taken)


# The model's own weights first (torchvision's training scripts save "model" beside
# "model_ema", and users load "model"), EMA copies only when alone; timm (ema_first) loads the EMA
# first: timm.models.load_checkpoint(use_ema=True), its default.
_CONTAINER_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "params",
                   "state_dict_ema", "model_ema", "ema")
EMA_KEYS = ("state_dict_ema", "model_ema", "ema")


def unwrap_state_dict(data: Any, where: str, *, ema_first: bool = False,
                      taken: list[tuple[str, list[str]]] | None = None) -> dict[str, Any]:
    """The tensor dict inside a checkpoint (itself, or under a usual container key: the model's
    own weights first, the EMA copy first with ``ema_first``). ``taken`` receives, per level
    unwrapped, the key followed and the other container keys beside it (so a caller can say
    which weights it took)."""
    keys = (*EMA_KEYS, *_CONTAINER_KEYS) if ema_first else _CONTAINER_KEYS
    for _ in range(3):
        if isinstance(data, dict) and data and all(_is_tensor(v) for v in data.values()):
            return dict(data)
        if not isinstance(data, dict):
            break
        key = next((k for k in keys if isinstance(data.get(k), dict)), None)
        inner = None if key is None else data[key]
        if taken is not None and key is not None:
            taken.append((key, [k for k in _CONTAINER_KEYS
                                if k != key and isinstance(data.get(k), dict)]))
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
    """An MLX / NumPy array as NumPy (MLX bfloat16 becomes float32: NumPy has no bfloat16)."""
    if isinstance(value, np.ndarray):
        return value
    try:
        return np.asarray(value)
    except (TypeError, ValueError, RuntimeError):  # MLX bfloat16
        import mlx.core as mx

        return np.asarray(value.astype(mx.float32))
