"""VarBuilder: hands a model its tensors, by name, on one device and in one dtype.

A VarBuilder wraps a source of named tensors (safetensors files, an in-memory dict, or a
:class:`~candle_nn.var_map.VarMap` that creates missing variables from seeded initialisers) and a
prefix. ``vb.pp("layer1").pp(0).get((64, 64, 3, 3), "conv1.weight")`` asks for
``layer1.0.conv1.weight`` and checks its shape. Tensors come in candle/PyTorch layout (conv
``(O, I, kH, kW)``, linear ``(out, in)``); converting to MLX layouts is the layers' job.

Every tensor returned lives on ``vb.device`` in ``vb.dtype`` (cast on that device's stream);
a weight stored as an integer or boolean type is a DTypeError naming it and its file (index
buffers are read with ``vb.get(..., integer=True)`` and keep their dtype). Safetensors files
are opened lazily and memory-mapped: only the tensors a model asks for are read.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
from typing import Any, Callable, Iterable, Mapping, Sequence

import mlx.core as mx
import numpy as np

from .checkpoint import LAYOUT_KEY
from .device import Device, as_device
from .errors import DTypeError, MissingTensorError, ShapeMismatchError, WeightsFileError
from .init import DEFAULT_KAIMING_NORMAL, ZEROS, Init
from .safetensors_io import (  # noqa: F401  (re-exported: candle_nn's public names)
    check_weights_path, mlx_wrote, open_safetensors, read_tensor,
)
from .var_map import VarMap

_FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)
_DTYPE_NAMES = {"float32": mx.float32, "f32": mx.float32, "float16": mx.float16,
                "f16": mx.float16, "bfloat16": mx.bfloat16, "bf16": mx.bfloat16}


def _dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).removeprefix("mlx.core.")


def as_dtype(dtype: "mx.Dtype | str") -> mx.Dtype:
    """``mx.float32`` / ``"float16"`` / ``"bf16"`` → an MLX floating dtype."""
    if isinstance(dtype, str):
        if dtype.lower() not in _DTYPE_NAMES:
            raise DTypeError(f"unknown dtype {dtype!r}: use float32, float16 or bfloat16")
        return _DTYPE_NAMES[dtype.lower()]
    if dtype not in _FLOAT_DTYPES:
        raise DTypeError(f"VarBuilder dtype must be float32, float16 or bfloat16, not {dtype}")
    return dtype


# Tensors no model reads: PyTorch BatchNorm's step counter (``*.`` matches any prefix).
NEVER_READ = ("*num_batches_tracked",)


class TensorSource:
    """Where a VarBuilder's tensors come from: subclass it and pass an instance to
    ``VarBuilder(source, dtype=, device=)`` to serve tensors from elsewhere (``weights/spec.py``
    records what a model asks for this way).

    A subclass sets ``entries``, a mapping from each tensor name it holds to whatever it needs to
    read that tensor, and implements ``_shape_of``, ``fetch`` and ``describe``; ``names``,
    ``contains`` and ``shape`` (a MissingTensorError with the closest names for an unknown one)
    follow from ``entries``. A source that holds nothing keeps the empty default.
    """

    entries: Mapping[str, Any] = {}

    def names(self) -> list[str]:
        return list(self.entries)

    def contains(self, path: str) -> bool:
        return path in self.entries

    def shape(self, path: str) -> tuple[int, ...]:
        return self._shape_of(path, self.entry(path))

    def entry(self, path: str) -> Any:
        """``entries[path]``, or the MissingTensorError of :meth:`missing`."""
        if path not in self.entries:
            raise self.missing(path)
        return self.entries[path]

    def _shape_of(self, path: str, entry: Any) -> tuple[int, ...]:
        raise NotImplementedError

    def fetch(self, path: str, shape: tuple[int, ...] | None, init: Init | None,
              dtype: mx.Dtype) -> mx.array:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    metadata: dict[str, str] = {}

    def written_by_mlx(self, path: str) -> bool:
        """Whether tensor ``path`` comes from a file that MLX wrote (so may be in MLX's layout)."""
        return False

    def missing(self, path: str) -> MissingTensorError:
        names = self.names()
        close = difflib.get_close_matches(path, names, n=3, cutoff=0.5)
        hint = f" Closest names: {', '.join(close)}." if close else ""
        return MissingTensorError(
            f"tensor '{path}' not found in {self.describe()} ({len(names)} tensors).{hint} "
            "Check the model variant and the weights file (candle-nn-weights inspect FILE)."
        )


class _SafetensorsSource(TensorSource):
    """``entries``: each tensor name's open file handle."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = [os.fspath(p) for p in paths]
        self.entries: dict[str, Any] = {}
        self._file_of: dict[str, str] = {}
        self.metadata = {}
        for path in self.paths:
            handle = open_safetensors(path)
            try:
                keys = list(handle.keys())
                self.metadata.update(handle.metadata() or {})
            except Exception as exc:
                raise WeightsFileError(f"{path}: unreadable safetensors header ({exc})") from exc
            for key in keys:
                self.entries[key] = handle
                self._file_of[key] = path

    def _shape_of(self, path: str, handle: Any) -> tuple[int, ...]:
        return tuple(handle.get_slice(path).get_shape())

    def fetch(self, path, shape, init, dtype):
        return read_tensor(self.entry(path), self._file_of[path], path)

    def describe(self) -> str:
        return ", ".join(self.paths)

    def written_by_mlx(self, path: str) -> bool:
        if path not in self._file_of:
            return False
        file = self._file_of[path]
        if (self.entries[path].metadata() or {}).get(LAYOUT_KEY) == "candle":
            return False
        stat = os.stat(file)
        return mlx_wrote(file, stat.st_ino, stat.st_mtime_ns, stat.st_size)


class _TensorsSource(TensorSource):
    """``entries``: the arrays (MLX or NumPy) themselves."""

    def __init__(self, tensors: Mapping[str, Any]) -> None:
        self.entries = dict(tensors)
        self.metadata = {}

    def _shape_of(self, path: str, value: Any) -> tuple[int, ...]:
        return tuple(np.shape(value))

    def fetch(self, path, shape, init, dtype):
        value = self.entry(path)
        return value if isinstance(value, mx.array) else mx.array(np.asarray(value))

    def describe(self) -> str:
        return "the in-memory tensor dict"


class _VarMapSource(TensorSource):
    """``entries``: the VarMap (its variables so far; ``fetch`` creates the missing ones)."""

    def __init__(self, varmap: VarMap, seed: int) -> None:
        self.varmap = self.entries = varmap
        self.seed = int(seed)
        self.metadata = {}

    def _shape_of(self, path: str, value: mx.array) -> tuple[int, ...]:
        return tuple(value.shape)

    def fetch(self, path, shape, init, dtype):
        if shape is None:
            if path in self.varmap:
                return self.varmap[path]
            raise MissingTensorError(
                f"tensor '{path}' is not in the VarMap and no shape was given to create it"
            )
        if init is None:
            init = DEFAULT_KAIMING_NORMAL if len(shape) >= 2 else ZEROS
        return self.varmap.get_or_create(path, shape, init, seed=self.seed, dtype=dtype)

    def describe(self) -> str:
        return f"the VarMap (seed {self.seed})"


class _ReadLog:
    """The tensors read through a builder and its ``pp`` children, each with the step of its
    last read, and where the load in progress began: a tensor read again after a
    ``check_all_read`` covering it starts a new load (another model built from the same
    builder), whose check counts only its own reads. So a builder that loaded a larger variant
    cannot vouch for a smaller one, while the parts of one load (a head checked, then the model
    around it) still add up."""

    def __init__(self) -> None:
        self.step = 0
        self.start = 0  # the first step of the load in progress
        self.last: dict[str, int] = {}  # full name -> step of its last read
        self._checked: dict[str, int] = {}  # prefix -> step of its last check

    def read(self, name: str) -> None:
        self.step += 1
        before, covered = self.last.get(name), self._covered(name)
        if before is not None and before < covered and covered > self.start:
            self.start = self.step  # the first re-read since that check
        self.last[name] = self.step

    def checked(self, prefix: str) -> None:
        self.step += 1
        self._checked[prefix] = self.step

    def read_in_this_load(self, name: str) -> bool:
        return self.last.get(name, -1) >= self.start

    def _covered(self, name: str) -> int:
        """The step of the last check whose prefix covers ``name`` (0: none)."""
        return max((step for p, step in self._checked.items()
                    if not p or name.startswith(p + ".")), default=0)


class VarBuilder:
    """Named-tensor access with a prefix, a dtype and a device. See the module docstring.

    Build with :meth:`from_safetensors`, :meth:`from_tensors` or :meth:`from_varmap`; narrow with
    :meth:`pp`; read with :meth:`get`.
    """

    def __init__(self, source: TensorSource, *, dtype: mx.Dtype, device: Device,
                 prefix: tuple[str, ...] = (), reads: "_ReadLog | None" = None,
                 checks: list[tuple[str, tuple[str, ...]]] | None = None) -> None:
        self._source = source
        self._dtype = dtype
        self._device = device
        self._prefix = prefix
        self._reads = _ReadLog() if reads is None else reads  # shared with pp children
        # (prefix, unused patterns) of every check_all_read so far
        self._checks = [] if checks is None else checks

    # -- constructors -----------------------------------------------------------------------
    @classmethod
    def from_safetensors(cls, paths: "str | os.PathLike | Iterable[str | os.PathLike]", *,
                         dtype: "mx.Dtype | str" = mx.float32,
                         device: "Device | str | None" = None) -> "VarBuilder":
        """Tensors from one or several safetensors files (opened lazily, memory-mapped)."""
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        paths = [os.fspath(p) for p in paths]
        if not paths:
            raise WeightsFileError("VarBuilder.from_safetensors needs at least one file")
        return cls(_SafetensorsSource(paths), dtype=as_dtype(dtype), device=as_device(device))

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Any], *, dtype: "mx.Dtype | str" = mx.float32,
                     device: "Device | str | None" = None) -> "VarBuilder":
        """Tensors from a dict of ``name -> mx.array | np.ndarray``."""
        return cls(_TensorsSource(tensors), dtype=as_dtype(dtype), device=as_device(device))

    @classmethod
    def from_varmap(cls, varmap: VarMap, *, dtype: "mx.Dtype | str" = mx.float32,
                    device: "Device | str | None" = None, seed: int = 0) -> "VarBuilder":
        """Variables created on demand in ``varmap``, each from its own (seed, path) stream."""
        return cls(_VarMapSource(varmap, seed), dtype=as_dtype(dtype), device=as_device(device))

    # -- navigation ---------------------------------------------------------------------------
    def pp(self, name: "str | int") -> "VarBuilder":
        """A VarBuilder whose names are prefixed by ``name`` (``vb.pp("layer1").pp(0)``)."""
        return VarBuilder(self._source, dtype=self._dtype, device=self._device,
                          prefix=self._prefix + (str(name),), reads=self._reads,
                          checks=self._checks)

    push_prefix = pp

    def with_dtype(self, dtype: "mx.Dtype | str") -> "VarBuilder":
        """The same source and prefix, another dtype."""
        return VarBuilder(self._source, dtype=as_dtype(dtype), device=self._device,
                          prefix=self._prefix, reads=self._reads, checks=self._checks)

    def path(self, name: str) -> str:
        """The full name of ``name`` under this prefix."""
        return ".".join(self._prefix + (name,)) if name else ".".join(self._prefix)

    @property
    def prefix(self) -> str:
        return ".".join(self._prefix)

    @property
    def dtype(self) -> mx.Dtype:
        return self._dtype

    @property
    def device(self) -> Device:
        return self._device

    @property
    def metadata(self) -> dict[str, str]:
        """The safetensors metadata of the source files (empty for other sources)."""
        return dict(self._source.metadata)

    # -- queries ------------------------------------------------------------------------------
    def contains(self, name: str) -> bool:
        """Whether the source holds ``prefix.name``."""
        return self._source.contains(self.path(name))

    def names(self) -> list[str]:
        """Every tensor name under this prefix (full names)."""
        head = self.prefix + "." if self._prefix else ""
        return [n for n in self._source.names() if n.startswith(head)]

    def shape(self, name: str) -> tuple[int, ...]:
        """The stored shape of ``prefix.name`` without reading the tensor."""
        return self._source.shape(self.path(name))

    def written_by_mlx(self, name: str) -> bool:
        """Whether ``prefix.name`` comes from a file written by MLX without candle_nn's layout
        marker (conv weights there may be in MLX's layout; see ``checkpoint.check_conv_layout``)."""
        return self._source.written_by_mlx(self.path(name))

    def track(self, module: Any) -> None:
        """Let a VarMap source remember ``module`` (built from its variables) for
        ``VarMap.save``."""
        if isinstance(self._source, _VarMapSource):
            self._source.varmap.track(module)

    def accessed(self) -> set[str]:
        """Full names of every tensor read so far through this builder or its ``pp`` children."""
        return set(self._reads.last)

    def unread(self, unused: Iterable[str] = ()) -> list[str]:
        """Full names of the source's tensors under this prefix that the load in progress has not
        read through this builder (or its ``pp`` children), except those matching an ``fnmatch``
        pattern of ``unused`` (relative to this prefix) or :data:`NEVER_READ`. A tensor read
        again after a :meth:`check_all_read` covering it starts a new load: another model built
        from the same builder counts only its own reads (from a VarMap, the variables earlier
        models made count as read)."""
        patterns = self._patterns(unused)
        # A VarMap's variables were made by the models built from it: one read by an earlier
        # load is another model's, not a sign of the wrong variant. A file vouches per load.
        earlier_ok = isinstance(self._source, _VarMapSource)
        return sorted(n for n in self.names() if not self._reads.read_in_this_load(n)
                      and not (earlier_ok and n in self._reads.last)
                      and not any(fnmatch.fnmatchcase(n, p) for p in patterns))

    def _patterns(self, unused: Iterable[str]) -> tuple[str, ...]:
        head = self.prefix + "." if self._prefix else ""
        return tuple(head + u for u in (*unused, *NEVER_READ))

    def declared_unused(self, name: str) -> bool:
        """Whether the ``check_all_read`` calls so far would let tensor ``name`` (a full name)
        stay unread: at least one covers its prefix, and each that does declared it unused.
        (``candle_nn_models.weights.spec`` asks this of a recorded build.)"""
        covering = [patterns for head, patterns in self._checks if name.startswith(head)]
        return bool(covering) and all(any(fnmatch.fnmatchcase(name, p) for p in patterns)
                                      for patterns in covering)

    def check_all_read(self, model: str, *, unused: Iterable[str] = (),
                       hint: "str | Callable[[], str]" = "") -> None:
        """Refuse weights holding tensors ``model`` did not read (another variant's extra blocks,
        a larger head): called at the end of a model's or part's ``load``, after every ``get``.

        ``unused``: ``fnmatch`` patterns, relative to this prefix, of tensors ``model`` knowingly
        leaves (``"head.*"``); PyTorch's BatchNorm step counter ``num_batches_tracked`` is never
        read. ``hint``: what the file holds instead, when the caller can tell (a callable: asked
        only on failure). Raises ShapeMismatchError naming a few of the unread tensors. A source
        that holds nothing (a fresh VarMap) passes.
        """
        unused = tuple(unused)
        self._checks.append((self.prefix + "." if self._prefix else "", self._patterns(unused)))
        left = self.unread(unused)
        self._reads.checked(self.prefix)
        if not left:
            return
        shown = ", ".join(left[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
        hint = hint() if callable(hint) else hint
        hint = f" {hint}" if hint else ""
        raise ShapeMismatchError(
            f"{self._source.describe()} holds {len(left)} tensor{'s' if len(left) > 1 else ''} "
            f"{model} does not read "
            f"({shown}): the weights are for another model or variant.{hint} Build the model "
            "the file holds (candle-nn-weights inspect FILE says which)")

    # -- reading ------------------------------------------------------------------------------
    def get(self, shape: "Sequence[int] | int | None", name: str,
            init: Init | None = None, *, integer: bool = False) -> mx.array:
        """Tensor ``prefix.name``, checked against ``shape`` (``None``: any shape; an int ``n``
        means ``(n,)``, as candle's ``vb.get(n, "bias")``).

        ``init`` is used only by VarMap-backed builders to create a missing variable.
        Weights are floating point: a tensor stored as an integer or boolean type is a
        DTypeError, unless ``integer=True`` asks for such a tensor (an index buffer), which then
        keeps its dtype. Raises MissingTensorError / ShapeMismatchError / DTypeError.
        """
        path = self.path(name)
        if isinstance(shape, (int, np.integer)):
            shape = (shape,)
        want = None if shape is None else tuple(int(s) for s in shape)
        value = self._source.fetch(path, want, init, self._dtype)
        if want is not None and tuple(value.shape) != want:
            raise ShapeMismatchError(
                f"tensor '{path}' in {self._source.describe()} has shape {tuple(value.shape)}, "
                f"the model expects {want}. The weights are probably for another model variant "
                "or class count."
            )
        floating = value.dtype in _FLOAT_DTYPES or value.dtype == mx.float64
        if not floating and not integer:
            raise DTypeError(
                f"tensor '{path}' in {self._source.describe()} is {_dtype_name(value.dtype)}, not "
                "floating point: model weights must be float32, float16 or bfloat16 (an integer "
                "or quantized checkpoint cannot be loaded; convert the weights to float)")
        self._reads.read(path)
        if floating and value.dtype != self._dtype:
            # MLX has float64 on the CPU only (Metal has none, CUDA lacks most kernels): narrow a
            # float64 source (an F64 file, a NumPy default array) there; the rest on the device.
            stream = mx.cpu if value.dtype == mx.float64 else self._device.stream
            with mx.stream(stream):
                value = value.astype(self._dtype)
        return value

    def __repr__(self) -> str:
        return (f"VarBuilder(prefix={self.prefix!r}, dtype={self._dtype}, device={self._device}, "
                f"source={self._source.describe()})")
