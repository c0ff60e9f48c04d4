"""Reading ``torch.save`` files without torch: the container, its tensor storages, nothing else.

``torch.load`` hands a zip that looks like a TorchScript archive to ``torch.jit.load``, which runs
the archive's code (a scripted ``__setstate__``) before any unpickler is consulted. So checkpoints
are never given to torch: this module decides from the file's bytes what it is, and reads only
the two layouts ``torch.save`` writes —

* zip (PyTorch >= 1.6): one folder ``P/`` holding ``data.pkl`` (the pickle), ``data/<key>`` (raw
  storages), ``version``, ``byteorder``, ``.format_version``, ``.storage_alignment`` and
  ``.data/serialization_id``. Anything else (TorchScript's ``code/`` and ``constants.pkl``,
  extra pickles, a second folder) is refused before anything is unpickled.
* legacy (``_use_new_zipfile_serialization=False``): the pickles ``MAGIC``, protocol version and
  system info, the object pickle, the list of storage keys, then each storage as a little-endian
  int64 element count followed by its bytes.

The object pickle is read by the caller's restricted unpickler
(:mod:`candle_nn_models.weights.torch_pickle`); this module gives it the storages as 1-D NumPy
arrays (bfloat16 as its uint16 bit patterns). Malformed or foreign files raise
:class:`candle_nn.WeightsFileError`.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import re
import struct
import zipfile
from dataclasses import dataclass
from typing import IO, Any, Callable

import numpy as np

from candle_nn import WeightsFileError

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001

# torch's storage classes -> element type. bfloat16 has no NumPy dtype: its bits are read as uint16.
STORAGE_DTYPES: dict[str, str] = {
    "DoubleStorage": "f8", "FloatStorage": "f4", "HalfStorage": "f2", "BFloat16Storage": "u2",
    "LongStorage": "i8", "IntStorage": "i4", "ShortStorage": "i2", "CharStorage": "i1",
    "ByteStorage": "u1", "BoolStorage": "?", "UntypedStorage": "u1",
}

# What reading a zip may inflate beyond the file's own size: torch.save stores its records
# uncompressed, so a real checkpoint reads about its size; a deflated entry claiming more (a zip
# bomb: 1 MB inflating to GBs) is refused from the zip directory before anything is inflated.
INFLATE_MARGIN = 64 << 20

# Records of a plain torch.save zip, below its one folder.
_PLAIN_RECORDS = re.compile(
    r"(data\.pkl|version|\.data/version|byteorder|\.format_version|\.storage_alignment"
    r"|\.data/serialization_id|data/\w+)")
_TORCHSCRIPT_HINT = (
    "a TorchScript archive (torch.jit.save), which holds code that loading it would run; refusing "
    "to read it. Convert the model's weights instead: torch.save(model.state_dict(), 'weights.pt')")


@dataclass(frozen=True)
class StorageType:
    """What a pickle's ``torch.FloatStorage``-style global becomes: the storage's element type."""

    name: str
    bfloat16: bool

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(STORAGE_DTYPES[self.name])


def storage_type(name: str) -> StorageType | None:
    """The :class:`StorageType` of a ``torch.<name>`` global, or ``None`` if it is not one."""
    if name not in STORAGE_DTYPES:
        return None
    return StorageType(name, bfloat16=name == "BFloat16Storage")


# persistent_load(pid) -> the storage object the pickle refers to
PersistentLoad = Callable[[Any], Any]
# (file, persistent_load) -> an Unpickler whose load() returns the checkpoint's object
MakeUnpickler = Callable[[IO[bytes], PersistentLoad], pickle.Unpickler]


def describe(path: str) -> str:
    """``"zip"`` or ``"legacy"`` for the two torch.save layouts; else WeightsFileError saying what
    the file is (TorchScript, safetensors, a plain pickle, something else)."""
    with open(path, "rb") as f:
        head = f.read(64)
    if head.startswith(b"PK\x03\x04") or zipfile.is_zipfile(path):
        _zip_folder(path)  # refuses TorchScript and foreign zips
        return "zip"
    if head.startswith(b"\x80") and _legacy_magic(head):
        return "legacy"
    if len(head) >= 10 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] < 100_000_000:
        raise WeightsFileError(f"{path} is a safetensors file, not a PyTorch pickle: name it "
                               "*.safetensors")
    if not head:
        raise WeightsFileError(f"{path} is empty")
    what = "a plain Python pickle" if head.startswith(b"\x80") else "not a PyTorch checkpoint"
    raise WeightsFileError(
        f"{path} is {what} (neither a torch.save zip nor a legacy torch.save pickle); "
        "re-save the weights with torch.save(model.state_dict(), path)")


def _legacy_magic(head: bytes) -> bool:
    """Whether ``head`` opens with the pickled legacy magic number. Read opcode by opcode
    (``pickletools.genops`` only parses): unpickling the bytes would run what they name."""
    ops = []
    try:
        for opcode, arg, _ in pickletools.genops(io.BytesIO(head)):
            if opcode.name not in ("PROTO", "FRAME"):
                ops.append((opcode.name, arg))
            if opcode.name == "STOP" or len(ops) > 2:
                break
    except Exception:  # unparsable bytes are simply not the magic number
        return False
    return len(ops) == 2 and ops[0][0] in ("LONG1", "LONG4") and ops[0][1] == LEGACY_MAGIC \
        and ops[1][0] == "STOP"


def _zip_folder(path: str) -> str:
    """The one folder of a plain torch.save zip; WeightsFileError for anything else."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise WeightsFileError(f"{path} is a damaged or truncated zip archive ({exc})") from exc
    folders = {n.split("/", 1)[0] for n in names}
    if any(n.split("/")[-1] == "constants.pkl" or "/code/" in f"/{n}" for n in names):
        raise WeightsFileError(f"{path} is {_TORCHSCRIPT_HINT}")
    if len(folders) != 1 or f"{next(iter(folders))}/data.pkl" not in names:
        raise WeightsFileError(
            f"{path} is a zip archive but not a torch.save checkpoint (no single folder with a "
            "data.pkl)")
    folder = folders.pop()
    foreign = [n for n in names if "/" not in n or not _PLAIN_RECORDS.fullmatch(n.split("/", 1)[1])]
    if foreign:
        raise WeightsFileError(
            f"{path} holds {foreign[0]}, which a torch.save checkpoint does not: refusing to "
            "read an archive of another kind (TorchScript, torch.export, a custom zip)")
    return folder


def load(path: str, make_unpickler: MakeUnpickler) -> Any:
    """The object a torch.save file holds, unpickled by ``make_unpickler``'s unpickler."""
    kind = describe(path)
    return _load_zip(path, make_unpickler) if kind == "zip" else _load_legacy(path, make_unpickler)


def _storage_pid(pid: Any, fields: int) -> tuple[StorageType, str, int, Any]:
    """``(type, key, numel, rest)`` of a ``("storage", type, key, location, numel, *rest)`` id."""
    if not (isinstance(pid, tuple) and len(pid) == fields and pid[0] in ("storage", b"storage")
            and isinstance(pid[1], StorageType) and isinstance(pid[4], int) and pid[4] >= 0):
        raise WeightsFileError(f"unexpected storage reference {str(pid)[:80]} in the pickle")
    key = pid[2].decode("ascii") if isinstance(pid[2], bytes) else str(pid[2])
    return pid[1], key, pid[4], pid[5:]


class _ReadBudget:
    """The bytes a zip's entries may inflate to in all: the file's size plus
    :data:`INFLATE_MARGIN`. Each entry's size is checked from the zip directory before it is
    read, and zipfile never returns more than that size, so memory stays bounded whatever the
    file claims."""

    def __init__(self, path: str) -> None:
        self.path, self.left = path, os.path.getsize(path) + INFLATE_MARGIN

    def read(self, zf: zipfile.ZipFile, info: zipfile.ZipInfo, size: int | None = None) -> bytes:
        """``size`` bytes (all when ``None``) of the entry ``info``, within the budget."""
        size = info.file_size if size is None else min(size, info.file_size)
        if size > self.left:
            raise WeightsFileError(
                f"{self.path}: {info.filename} would inflate to {size} bytes, more than the "
                f"{os.path.getsize(self.path)}-byte file can hold uncompressed (a zip bomb?); "
                "refusing to inflate it. Re-save the checkpoint with torch.save")
        self.left -= size
        with zf.open(info) as fh:
            return fh.read(size)


def _load_zip(path: str, make_unpickler: MakeUnpickler) -> Any:
    folder = _zip_folder(path)
    budget = _ReadBudget(path)
    with zipfile.ZipFile(path) as zf:
        order = budget.read(zf, zf.getinfo(f"{folder}/byteorder")).strip() \
            if f"{folder}/byteorder" in zf.namelist() else b"little"
        endian = {b"little": "<", b"big": ">"}.get(order)
        if endian is None:
            raise WeightsFileError(f"{path}: unknown byte order {order[:20]!r}")
        storages: dict[str, tuple[StorageType, np.ndarray]] = {}

        def persistent_load(pid: Any) -> tuple[StorageType, np.ndarray]:
            stype, key, numel, _ = _storage_pid(pid, 5)
            if key not in storages:
                name = f"{folder}/data/{key}"
                dtype = stype.dtype.newbyteorder(endian)
                try:
                    info = zf.getinfo(name)
                except KeyError:
                    raise WeightsFileError(f"{path}: storage {name} is missing") from None
                nbytes = numel * dtype.itemsize
                if info.file_size < nbytes:
                    raise WeightsFileError(
                        f"{path}: storage {name} holds {info.file_size} bytes, the pickle needs "
                        f"{nbytes} (truncated file?)")
                storages[key] = (stype, _native(budget.read(zf, info, nbytes), dtype))
            stored_type, array = storages[key]
            return stored_type, array

        pickled = budget.read(zf, zf.getinfo(f"{folder}/data.pkl"))
        return make_unpickler(io.BytesIO(pickled), persistent_load).load()


def _load_legacy(path: str, make_unpickler: MakeUnpickler) -> Any:
    """Two passes over the object pickle: the storages' bytes come after it, and a tensor is
    only rebuilt (copied, bfloat16 widened) once they are known."""
    with open(path, "rb") as f:
        header = make_unpickler(f, _no_storages)
        magic, protocol = header.load(), make_unpickler(f, _no_storages).load()
        if magic != LEGACY_MAGIC or protocol != LEGACY_PROTOCOL:
            raise WeightsFileError(f"{path}: not a legacy torch.save file (protocol {protocol!r})")
        sys_info = make_unpickler(f, _no_storages).load()
        endian = "<" if not isinstance(sys_info, dict) or sys_info.get("little_endian", True) \
            else ">"
        start, file_size = f.tell(), os.path.getsize(path)
        found: dict[str, tuple[StorageType, int]] = {}
        storages: dict[str, tuple[StorageType, np.ndarray]] = {}

        def persistent_load(pid: Any) -> Any:
            if isinstance(pid, tuple) and pid and pid[0] in ("module", b"module"):
                return pid[1]  # a whole-module pickle names its class here (a stand-in)
            stype, key, numel, (view,) = _storage_pid(pid, 6)
            if view is not None:
                raise WeightsFileError(f"{path}: storage views (PyTorch < 0.4 files) are not "
                                       "supported; re-save the file with a current torch.save")
            if key in storages:
                return storages[key]
            if numel * stype.dtype.itemsize > file_size:  # its bytes must be in the file
                raise WeightsFileError(f"{path}: storage {key} claims {numel} elements, more "
                                       f"than the {file_size}-byte file holds")
            found.setdefault(key, (stype, numel))
            return stype, np.zeros(numel, stype.dtype)

        make_unpickler(f, persistent_load).load()
        keys = make_unpickler(f, _no_storages).load()
        if not isinstance(keys, list) or set(keys) != set(found):
            raise WeightsFileError(f"{path}: the storage list does not match the pickle")
        for key in keys:
            stype, numel = found[key]
            dtype = stype.dtype.newbyteorder(endian)
            size = f.read(8)
            raw = f.read(numel * dtype.itemsize)
            if len(size) != 8 or struct.unpack("<q", size)[0] != numel \
                    or len(raw) != numel * dtype.itemsize:
                raise WeightsFileError(f"{path}: storage {key} is truncated or has the wrong size")
            storages[key] = (stype, _native(raw, dtype))
        f.seek(start)
        return make_unpickler(f, persistent_load).load()


def _native(raw: bytes, dtype: np.dtype) -> np.ndarray:
    """A storage's bytes as a 1-D array in this machine's byte order (no copy when it is)."""
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="), copy=False)


def _no_storages(pid: Any) -> Any:
    raise WeightsFileError(f"unexpected storage reference {str(pid)[:80]} in a header pickle")
