"""Reading safetensors files: the path checks (one clear error for each bad path), opening
(memory-mapped, lazily) and reading one tensor as an MLX array.

Shared by :class:`~candle_nn.var_builder.VarBuilder` (its file sources) and
:class:`~candle_nn.var_map.VarMap` (loading saved variables).
"""

from __future__ import annotations

import functools
import json
import os
import stat
import struct
from typing import Any

import mlx.core as mx
import numpy as np

from .errors import WeightsFileError

_FILE_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
_NOT_FOUND_HINT = (". Pass the path of a .safetensors file (see `candle-nn-weights list` for "
                   "known checkpoints).")


def check_weights_path(path: "str | os.PathLike", what: str = "weights file") -> str:
    """``path`` as a str when it names a regular file this process may read; else a
    WeightsFileError that says what it is instead (missing, a directory, a FIFO — which would
    block a reader forever —, a device such as /dev/null, a socket, unreadable)."""
    path = os.fspath(path)
    hint = _NOT_FOUND_HINT if what == "weights file" else ""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise WeightsFileError(f"{what} not found: {path}{hint}") from None
    except PermissionError:
        raise WeightsFileError(
            f"permission denied: cannot reach {what} {path} (a folder on the way is not "
            "searchable by this user)") from None
    except OSError as exc:
        raise WeightsFileError(f"cannot open {what} {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise WeightsFileError(f"{what} {path} is a directory, not a file")
    for is_kind, kind in _FILE_KINDS:
        if is_kind(info.st_mode):
            raise WeightsFileError(f"{what} {path} is {kind}, not a regular file")
    try:
        with open(path, "rb"):
            pass
    except PermissionError:
        raise WeightsFileError(
            f"permission denied reading {what} {path}: this user may not read it (chmod +r?)"
        ) from None
    except OSError as exc:
        raise WeightsFileError(f"cannot open {what} {path}: {exc.strerror or exc}") from None
    return path


def open_safetensors(path: "str | os.PathLike") -> Any:
    """Open a safetensors file lazily (memory-mapped); malformed files raise WeightsFileError."""
    from safetensors import safe_open

    path = check_weights_path(path)
    try:
        return safe_open(path, framework="mlx")
    except Exception as exc:  # the Rust parser's errors have no common Python base
        pytorch = pytorch_checkpoint_kind(path)
        if pytorch is not None:
            out = os.path.splitext(os.path.basename(path))[0] + ".safetensors"
            raise WeightsFileError(
                f"{path} is a PyTorch checkpoint, not a safetensors file: convert it first with "
                f"`candle-nn-weights convert --from {pytorch} {path} {out}` and pass {out}"
            ) from exc
        raise WeightsFileError(
            f"{path} is not a valid safetensors file ({type(exc).__name__}: {exc}). "
            "It may be truncated or corrupt: download or convert it again."
        ) from exc


def pytorch_checkpoint_kind(path: str) -> str | None:
    """``--from`` of ``candle-nn-weights convert`` for a PyTorch checkpoint (``torch.save``'s zip
    with a ``data.pkl``, or a legacy pickle), guessed from the names in its pickle without
    unpickling it (``torchvision``, ``ultralytics``, ``mobile_sam``, or every choice when the
    names do not tell); ``None`` for any other file."""
    import zipfile

    every = "torchvision|timm|ultralytics|mobile_sam"
    try:
        with open(path, "rb") as f:
            head = f.read(4)
        if head[:3] == b"\x80\x02\x8a":  # torch.save's legacy format: a pickled magic number
            return every
        if head != b"PK\x03\x04":
            return None
        with zipfile.ZipFile(path) as z:
            pickles = [i for i in z.infolist() if i.filename.endswith("/data.pkl")]
            if not pickles:
                return None
            with z.open(pickles[0]) as f:
                names = f.read(1 << 22)
    except (OSError, zipfile.BadZipFile, RuntimeError, ValueError):
        return None
    if b"ultralytics" in names:
        return "ultralytics"
    if b"image_encoder." in names and b"mask_decoder." in names:
        return "mobile_sam"
    if b"layer1.0.conv1.weight" in names:
        return "timm" if b"state_dict_ema" in names else "torchvision"
    return every


@functools.lru_cache(maxsize=4)
def _header(path: str, inode: int, mtime_ns: int, size: int) -> tuple[int, dict[str, Any]]:
    """``(offset of the data, header entries)`` of one version of a safetensors file, parsed once
    (not once per tensor: a file of N bfloat16 tensors would cost N header parses)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return 8 + n, json.loads(f.read(n))


@functools.lru_cache(maxsize=16)
def mlx_wrote(path: str, inode: int, mtime_ns: int, size: int) -> bool:
    """Whether MLX's writer made this safetensors file: it writes ``"__metadata__":null`` and each
    entry's keys sorted (``data_offsets`` first); the safetensors library (candle, PyTorch's
    converters) writes ``dtype`` first and no null metadata."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        raw = f.read(n)
    if b'"__metadata__":null' in raw:
        return True
    entries = json.loads(raw, object_pairs_hook=lambda pairs: pairs)
    keys = [pairs for name, pairs in entries if name != "__metadata__" and isinstance(pairs, list)]
    return bool(keys) and keys[0][0][0] == "data_offsets"


def _read_bfloat16(path: str, name: str) -> mx.array:
    """Read a bfloat16 tensor's raw bytes (safetensors' MLX loader goes through NumPy, which has
    no bfloat16). The header was already validated by ``safe_open``."""
    stat = os.stat(path)
    start, entries = _header(path, stat.st_ino, stat.st_mtime_ns, stat.st_size)
    entry = entries[name]
    begin, end = entry["data_offsets"]
    raw = np.fromfile(path, dtype=np.uint16, count=(end - begin) // 2, offset=start + begin)
    return mx.array(raw).view(mx.bfloat16).reshape(entry["shape"])


def read_tensor(handle: Any, path: str, name: str) -> mx.array:
    """Tensor ``name`` of the safetensors file ``path`` opened as ``handle`` (any dtype,
    bfloat16 included); unreadable data raises WeightsFileError."""
    dtype = "unknown dtype"
    try:
        dtype = handle.get_slice(name).get_dtype()
        if dtype == "BF16":
            return _read_bfloat16(path, name)
        return handle.get_tensor(name)
    except Exception as exc:  # the Rust reader's errors have no common Python base
        raise WeightsFileError(f"cannot read tensor '{name}' ({dtype}) from {path}: {exc}") from exc
