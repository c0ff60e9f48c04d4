"""VarMap: freshly created variables, for new models (and their checkpoints).

A :class:`VarMap` is filled through ``VarBuilder.from_varmap(varmap, seed=...)``: every tensor a
model asks for is created once, from its ``Init`` and its own seeded stream, and kept under its
full path in candle/PyTorch layout. :meth:`VarMap.save` writes a safetensors file that
``VarBuilder.from_safetensors`` loads back bit-exactly.
"""

from __future__ import annotations

import os
from typing import Iterator, Mapping, Sequence

import mlx.core as mx

from .errors import ShapeMismatchError, WeightsFileError
from .init import Init, variable_key


class VarMap:
    """An ordered mapping ``full path -> mx.array`` of created variables."""

    def __init__(self) -> None:
        self._vars: dict[str, mx.array] = {}

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
        """Write every variable to a safetensors file (written to a temp file, then renamed)."""
        path = os.fspath(path)
        tmp = f"{path}.tmp-{os.getpid()}.safetensors"  # MLX appends the suffix when missing
        try:
            mx.save_safetensors(tmp, dict(self._vars), metadata=dict(metadata or {}))
            os.replace(tmp, path)
        except (OSError, RuntimeError, ValueError) as exc:
            raise WeightsFileError(f"cannot write {path}: {exc}") from exc
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def load(self, path: str | os.PathLike) -> None:
        """Replace/add variables with the tensors of a safetensors file (shapes must agree)."""
        from .var_builder import open_safetensors, read_tensor

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
