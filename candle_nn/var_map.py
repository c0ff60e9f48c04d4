"""VarMap: freshly created variables, for new models (and their checkpoints).

A :class:`VarMap` is filled through ``VarBuilder.from_varmap(varmap, seed=...)``: every tensor a
model asks for is created once, from its ``Init`` and its own seeded stream, and kept under its
full path in candle/PyTorch layout. :meth:`VarMap.save` writes a safetensors file that
``VarBuilder.from_safetensors`` loads back bit-exactly.

The VarMap holds the variables as they were *created*: MLX's optimisers replace a module's arrays
rather than updating them, so after training the VarMap no longer reflects the model.
:meth:`VarMap.save` therefore refuses when a module built from it has had parameters replaced,
and names the call that saves the trained model: ``candle_nn.save_safetensors(model, path)``.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Iterator, Mapping, Sequence

import mlx.core as mx

from .checkpoint import write_safetensors
from .errors import ShapeMismatchError, WeightsFileError
from .init import Init, variable_key
from .safetensors_io import open_safetensors, read_tensor


class VarMap:
    """An ordered mapping ``full path -> mx.array`` of created variables."""

    def __init__(self) -> None:
        self._vars: dict[str, mx.array] = {}
        # every layer loaded from this VarMap (weakly: a layer folded away is forgotten)
        self._built: list[weakref.ref] = []

    def track(self, module: Any) -> None:
        """Remember ``module`` (built from these variables) and its arrays as they are now (kept
        on the module, so they go with it)."""
        module.__dict__["_built_arrays"] = {k: v for k, v in module.items()
                                           if isinstance(v, mx.array)}
        module.__dict__.setdefault("_varmaps", []).append(self)  # modules derived from it too
        if len(self._built) % 1024 == 1023:
            self._built = [ref for ref in self._built if ref() is not None]
        self._built.append(weakref.ref(module))

    def get_or_create(self, path: str, shape: Sequence[int], init: Init, *, seed: int,
                      dtype: mx.Dtype = mx.float32) -> mx.array:
        """The variable at ``path``, created from ``init`` with key (seed, path) when new."""
        shape = tuple(int(s) for s in shape)
        if path in self._vars:
            found = tuple(self._vars[path].shape)
            if found != shape:
                raise ShapeMismatchError(
                    f"variable '{path}' exists in the VarMap with shape {found}, "
                    f"but shape {shape} was requested"
                )
            return self._vars[path]
        value = init.sample(shape, variable_key(seed, path), dtype)
        self._vars[path] = value
        return value

    def save(self, path: str | os.PathLike, metadata: Mapping[str, str] | None = None) -> None:
        """Write every variable, as created, to a safetensors file (atomically).

        Raises WeightsFileError, writing nothing, when a module built from this VarMap has had
        its parameters replaced since (an optimiser step, ``module.update``): save the trained
        model with ``candle_nn.save_safetensors(model, path)`` instead.
        """
        for ref in self._built:
            module = ref()
            if module is None:
                continue
            arrays = module.__dict__["_built_arrays"]
            changed = [k for k, v in arrays.items() if module.get(k) is not v]
            if changed:
                where = f"{module.weights_prefix}.{changed[0]}" if module.weights_prefix \
                    else changed[0]
                raise WeightsFileError(
                    f"cannot write {os.fspath(path)} from the VarMap: '{where}' of a "
                    f"{type(module).__name__} built from it has changed since (trained?), and the "
                    "VarMap holds the initial values. Save the model's current parameters with "
                    "candle_nn.save_safetensors(model, path).")
        write_safetensors(path, self._vars, metadata)

    def load(self, path: str | os.PathLike) -> None:
        """Replace/add variables with the tensors of a safetensors file (shapes must agree)."""

        path = os.fspath(path)
        handle = open_safetensors(path)
        for name in handle.keys():
            value = read_tensor(handle, path, name)
            if name in self._vars and tuple(self._vars[name].shape) != tuple(value.shape):
                raise ShapeMismatchError(
                    f"'{name}' in {path} has shape {tuple(value.shape)}, "
                    f"the VarMap holds {tuple(self._vars[name].shape)}"
                )
            self._vars[name] = value

    def set(self, path: str, value: mx.array) -> None:
        """Set a variable's value (e.g. after training)."""
        self._vars[path] = value

    def all_vars(self) -> dict[str, mx.array]:
        """A copy of the path -> array mapping."""
        return dict(self._vars)

    def __contains__(self, path: object) -> bool:
        return path in self._vars

    def __getitem__(self, path: str) -> mx.array:
        return self._vars[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._vars)

    def __len__(self) -> int:
        return len(self._vars)
