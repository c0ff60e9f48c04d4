"""Saving modules in candle's safetensors layout, and refusing files in MLX's layout.

:func:`save_safetensors` writes a module's *current* parameters (after training, say) under
candle's names and in candle's layouts — conv ``(O, I/groups, kH, kW)``, transposed conv
``(I, O, kH, kW)``, linear ``(out, in)`` — so ``VarBuilder.from_safetensors`` and the module's
``load`` rebuild the same model, and candle (Rust) reads the file too.

Names: each layer built by ``Layer.load(vb, ...)`` writes under the VarBuilder path it was read
from (``Module.weights_prefix``); other parameters under their parent's prefix and attribute
path. **BatchNorms folded into a convolution at load** (``Conv2d.absorb_bn``, as ResNet and
YOLOv8 do) cannot be split again: such a conv writes its *folded* weight as ``<conv>.weight`` and
an identity BatchNorm under the BatchNorm's names (``running_mean`` 0, ``running_var`` 1 - eps,
``weight`` 1) whose ``bias`` carries the folded shift (or, for a conv with its own bias, the conv
bias carries it and the BatchNorm's bias is 0). Reloading the file gives the same outputs — bit
for bit in float32 — but the original BatchNorm statistics are not in it; the file's metadata says
so (``candle_nn.batch_norm = "folded"``).

Every file written here carries the metadata ``candle_nn.layout = "candle"``. Files written by MLX
itself (``mlx.nn.Module.save_weights``, ``mx.save_safetensors``) hold conv weights as
``(O, kH, kW, I)``; :func:`check_conv_layout` refuses them instead of reading them transposed.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import mlx.core as mx
import mlx.nn as nn

from .atomic_write import atomic_write
from .errors import WeightsFileError

LAYOUT_KEY = "candle_nn.layout"
BATCH_NORM_KEY = "candle_nn.batch_norm"
# The BatchNorms' eps and momentum (BatchNorm2d.load reads them; the converter writes them too)
BN_EPS_KEY = "candle_nn.bn_eps"
BN_MOMENTUM_KEY = "candle_nn.bn_momentum"
_SAVE_CALL = "candle_nn.save_safetensors(model, path)"


def write_safetensors(path: "str | os.PathLike", tensors: Mapping[str, mx.array],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` (already in candle's layout) atomically (a temp file, then renamed), with
    the ``candle_nn.layout = "candle"`` marker in the metadata."""
    path = os.fspath(path)
    meta = {"format": "pt", **dict(metadata or {}), LAYOUT_KEY: "candle"}
    try:
        # MLX appends ".safetensors" to a name without it: the temporary file keeps that suffix
        with atomic_write(path, suffix=".safetensors") as tmp:
            mx.save_safetensors(str(tmp), dict(tensors), metadata=meta)
    except (OSError, RuntimeError, ValueError) as exc:  # MLX's write errors are RuntimeErrors
        reason = getattr(exc, "strerror", None) or exc  # not the temporary file's name
        raise WeightsFileError(f"cannot write {path}: {reason}") from exc


def state_dict(module: nn.Module) -> dict[str, mx.array]:
    """``candle name -> tensor in candle's layout`` for every parameter of ``module``, as it is
    now. Raises WeightsFileError for parameters it cannot name or lay out (two parameters under
    one name, MLX's own ``mlx.nn`` layers)."""
    from .module import Module

    out: dict[str, mx.array] = {}

    def add(name: str, value: mx.array) -> None:
        if name in out:
            raise WeightsFileError(f"two parameters would be saved as '{name}'; give the modules "
                                   "distinct VarBuilder prefixes")
        out[name] = value

    def visit(value: Any, prefix: str) -> None:
        if isinstance(value, Module):
            prefix = value.weights_prefix if value.weights_prefix is not None else prefix
            if hasattr(value, "candle_tensors"):
                for name, tensor in value.candle_tensors(prefix).items():
                    add(name, tensor)
                return
            for key, child in value.items():
                if not key.startswith("_"):
                    visit(child, _join(prefix, key))
        elif isinstance(value, nn.Module):
            if value.parameters():
                raise WeightsFileError(
                    f"'{prefix}' is an mlx.nn.{type(value).__name__}, whose layout candle_nn "
                    "cannot vouch for; build the model from candle_nn layers to save it in "
                    "candle's layout")
        elif isinstance(value, mx.array):
            add(prefix, value)
        elif isinstance(value, (list, tuple)):
            for i, child in enumerate(value):
                visit(child, _join(prefix, str(i)))
        elif isinstance(value, dict):
            for key, child in value.items():
                visit(child, _join(prefix, str(key)))

    visit(module, "")
    return out


def save_safetensors(module: nn.Module, path: "str | os.PathLike",
                     metadata: Mapping[str, str] | None = None) -> dict[str, mx.array]:
    """Write ``module``'s current parameters to ``path`` in candle's layout (see the module
    docstring for names and folded BatchNorms); returns what was written."""
    tensors = state_dict(module)
    if not tensors:
        raise WeightsFileError(f"cannot write {os.fspath(path)}: the module has no parameters")
    meta = dict(metadata or {})
    if any(getattr(m, "_folded_bn", None) for _, m in module.named_modules()):
        meta[BATCH_NORM_KEY] = "folded"
    meta.update(_batch_norm_metadata(module))
    mx.eval(tensors)
    write_safetensors(path, tensors, meta)
    return tensors


def check_conv_layout(vb: Any, name: str, candle_shape: tuple[int, ...],
                      mlx_shape: tuple[int, ...], candle_axes: str) -> None:
    """Refuse ``vb``'s tensor ``name`` when it is (or may be) in MLX's ``(O, kH, kW, I)`` layout
    rather than candle's ``candle_axes`` ``candle_shape``: its shape is MLX's, or it reads the same
    in both layouts and the file was written by MLX without candle_nn's layout marker."""
    if not vb.contains(name):
        return  # a VarMap creates it in candle's layout; a missing tensor is reported by get()
    found = tuple(vb.shape(name))
    path = vb.path(name)
    if found != candle_shape and found == mlx_shape:
        raise WeightsFileError(
            f"tensor '{path}' has shape {found}: that is MLX's (O, kH, kW, I) layout (a file "
            f"written by mlx.nn.Module.save_weights?), not candle's {candle_axes} {candle_shape}. "
            f"Save candle_nn models with {_SAVE_CALL}, which writes candle's layout.")
    if found == candle_shape == mlx_shape and vb.written_by_mlx(name):
        raise WeightsFileError(
            f"tensor '{path}' comes from a file written by MLX (mlx.nn.Module.save_weights or "
            f"mx.save_safetensors) without candle_nn's layout marker, and its shape {found} "
            f"reads the same in MLX's (O, kH, kW, I) and candle's {candle_axes} layouts, so it "
            f"cannot be loaded safely. Save the model with {_SAVE_CALL}; a file known to be in "
            f"candle's layout can be re-saved with metadata {{'{LAYOUT_KEY}': 'candle'}}.")


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _batch_norm_metadata(module: nn.Module) -> dict[str, str]:
    """The BatchNorms' ``eps`` / ``momentum`` as metadata (``BatchNorm2d.load`` reads them back),
    each when every BatchNorm (kept or folded) shares one value (models' loaders use one)."""
    eps, momentum = set(), set()
    for _, m in module.named_modules():
        if hasattr(m, "running_var") and hasattr(m, "eps"):  # a BatchNorm2d (not imported here)
            eps.add(m.eps)
            momentum.add(m.momentum)
        elif getattr(m, "_folded_bn", None):
            eps.add(m._folded_bn[1])
    meta = {BN_EPS_KEY: repr(eps.pop())} if len(eps) == 1 else {}
    if len(momentum) == 1:
        meta[BN_MOMENTUM_KEY] = repr(momentum.pop())
    return meta
