"""Malformed safetensors files raise CandleNNError (WeightsFileError), never crash, hang or leak.

A safetensors file is ``u64 little-endian header length | JSON header | data``. Every case below
is built byte by byte and read through both public entry points: ``VarBuilder.from_safetensors``
followed by ``vb.get`` of every tensor, and ``VarMap.load``. The random-mutation fuzz loop runs in
a subprocess with a timeout, so a segfault or a hang fails the test instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import candle_nn as cn

ROOT = Path(__file__).resolve().parents[2]


def _env_with_root() -> dict[str, str]:
    """The environment for a child Python: this checkout first, the caller's path kept."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def blob(header, data: bytes = b"", *, raw: bytes | None = None,
         length: int | None = None) -> bytes:
    """A safetensors byte string: ``header`` as JSON (or ``raw`` header bytes), then ``data``."""
    head = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(head) if length is None else length) + head + data


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


VALID = blob({
    "__metadata__": {"format": "pt"},
    "conv.weight": entry("F32", [2, 3], 0, 24),
    "conv.bias": entry("F16", [4], 24, 32),
    "emb": entry("BF16", [2, 2], 32, 40),
    "ids": entry("I64", [2], 40, 56),
}, np.arange(56, dtype=np.uint8).tobytes())


def read_everything(path: Path) -> None:
    """Read every tensor (integer ones too) through both public entry points (raises on a bad
    file)."""
    vb = cn.VarBuilder.from_safetensors(path, device="cpu")
    for name in vb.names():
        vb.shape(name)
        mx.eval(vb.get(None, name, integer=True))
    cn.VarMap().load(path)


def write(tmp_path: Path, data: bytes, name: str = "w.safetensors") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def assert_rejected(path: Path, *fragments: str) -> None:
    """Both entry points raise WeightsFileError naming the file (and ``fragments``)."""
    with pytest.raises(cn.WeightsFileError) as info:
        vb = cn.VarBuilder.from_safetensors(path, device="cpu")
        for name in vb.names():
            mx.eval(vb.get(None, name, integer=True))
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    with pytest.raises(cn.WeightsFileError):
        cn.VarMap().load(path)


def test_the_valid_file_is_valid(tmp_path):
    path = write(tmp_path, VALID)
    read_everything(path)
    vb = cn.VarBuilder.from_safetensors(path, device="cpu")
    assert sorted(vb.names()) == ["conv.bias", "conv.weight", "emb", "ids"]
    assert vb.get(None, "ids", integer=True).dtype == mx.int64
    assert vb.get((2, 2), "emb").dtype == mx.float32


MALFORMED = {
    "empty": b"",
    "seven_bytes": VALID[:7],
    "header_only_length": struct.pack("<Q", 2),
    "header_length_beyond_file": blob(None, raw=b"{}", length=1000),
    "header_length_2_62": blob(None, raw=b"{}", length=2**62),
    "header_length_u64_max": blob(None, raw=b"{}", length=2**64 - 1),
    "invalid_json": blob(None, raw=b'{"a": {"dtype": "F32", '),
    "json_not_an_object": blob([1, 2, 3]),
    "json_number": blob(None, raw=b"42"),
    "non_utf8_name": blob(None, bytes(4), raw=b'{"\xff\xfe": {"dtype": "F32", "shape": [1], '
                                              b'"data_offsets": [0, 4]}}'),
    "unknown_dtype": blob({"a": entry("F33", [1], 0, 4)}, bytes(4)),
    "lowercase_dtype": blob({"a": entry("f32", [1], 0, 4)}, bytes(4)),
    "empty_dtype": blob({"a": entry("", [1], 0, 4)}, bytes(4)),
    "dtype_not_a_string": blob({"a": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}}, bytes(4)),
    "float8_dtype_unreadable_by_numpy": blob({"a": entry("F8_E4M3", [4], 0, 4)}, bytes(4)),
    "missing_data_offsets": blob({"a": {"dtype": "F32", "shape": [1]}}, bytes(4)),
    "missing_shape": blob({"a": {"dtype": "F32", "data_offsets": [0, 4]}}, bytes(4)),
    "offsets_beyond_data": blob({"a": entry("F32", [2], 0, 8)}, bytes(4)),
    "offsets_reversed": blob({"a": entry("F32", [0], 4, 0)}, bytes(4)),
    "offsets_overlapping": blob({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)},
                                bytes(12)),
    "offsets_with_gap": blob({"a": entry("F32", [1], 4, 8)}, bytes(8)),
    "offsets_inconsistent_with_shape": blob({"a": entry("F32", [3], 0, 8)}, bytes(8)),
    "offsets_inconsistent_with_dtype": blob({"a": entry("F16", [2], 0, 8)}, bytes(8)),
    "trailing_bytes_after_data": blob({"a": entry("F32", [1], 0, 4)}, bytes(8)),
    "negative_shape": blob({"a": entry("F32", [-1], 0, 4)}, bytes(4)),
    "fractional_shape": blob({"a": entry("F32", [1.5], 0, 4)}, bytes(4)),
    "huge_shape": blob({"a": entry("F32", [2**40], 0, 4)}, bytes(4)),
    "shape_overflowing_u64": blob({"a": entry("F32", [2**32, 2**32, 2**32], 0, 0)}),
    "shape_times_itemsize_overflowing": blob({"a": entry("F32", [2**62], 0, 0)}),
    "empty_tensor_with_a_dimension_mlx_cannot_hold": blob({"a": entry("F32", [2**40, 0], 0, 0)}),
    "offset_2_64": blob({"a": entry("F32", [1], 2**64 - 4, 2**64)}, bytes(4)),
    "metadata_not_strings": blob({"__metadata__": {"x": 1}}),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_file_raises_weights_file_error(tmp_path, case):
    assert_rejected(write(tmp_path, MALFORMED[case]))


def test_truncated_at_every_offset(tmp_path):
    for cut in range(len(VALID)):
        path = write(tmp_path, VALID[:cut], f"cut{cut}.safetensors")
        with pytest.raises(cn.WeightsFileError):
            read_everything(path)


def test_messages_say_what_is_wrong(tmp_path):
    assert_rejected(write(tmp_path, b"", "a.safetensors"), "not a valid safetensors file")
    assert_rejected(write(tmp_path, MALFORMED["float8_dtype_unreadable_by_numpy"], "b.safetensors"),
                    "'a'")


def test_a_bad_file_among_several_is_named(tmp_path):
    good = write(tmp_path, VALID, "good.safetensors")
    bad = write(tmp_path, VALID[:100], "bad.safetensors")
    with pytest.raises(cn.WeightsFileError, match="bad.safetensors"):
        cn.VarBuilder.from_safetensors([good, bad])


def test_valid_edge_cases_load(tmp_path):
    """Not everything unusual is an error: empty tensors, float64 and bool load."""
    path = write(tmp_path, blob({
        "empty": entry("F32", [0, 3], 0, 0),
        "f64": entry("F64", [1], 0, 8),
        "flags": entry("BOOL", [2], 8, 10),
    }, struct.pack("<d", 1.5) + b"\x01\x00"))
    vb = cn.VarBuilder.from_safetensors(path, device="cpu")
    assert vb.get((0, 3), "empty").shape == (0, 3)
    f64 = vb.get((1,), "f64")
    assert f64.dtype == mx.float32 and f64.item() == 1.5
    assert np.array(vb.get((2,), "flags", integer=True)).tolist() == [True, False]


FUZZ_SCRIPT = textwrap.dedent("""
    import os, random, sys
    import candle_nn as cn
    import mlx.core as mx

    valid, out_dir, n = bytes.fromhex(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    header_end = 8 + int.from_bytes(valid[:8], "little")
    rng = random.Random(20261122)
    outcomes = {"ok": 0, "rejected": 0}
    for i in range(n):
        data = bytearray(valid)
        for _ in range(rng.choice([1, 1, 2, 3, 8])):
            r = rng.random()
            if r < 0.15:  # the length prefix
                pos = rng.randrange(8)
            elif r < 0.85:  # the JSON header
                pos = rng.randrange(8, header_end)
            else:  # the data
                pos = rng.randrange(header_end, len(data))
            data[pos] = rng.choice([rng.randrange(256), ord('"'), ord('}'), ord(','), ord('9'),
                                    ord('-'), 0, 255])
        if rng.random() < 0.1:
            data = data[:rng.randrange(len(data))]
        path = os.path.join(out_dir, f"fuzz{i}.safetensors")
        with open(path, "wb") as f:
            f.write(data)
        try:
            vb = cn.VarBuilder.from_safetensors(path, device="cpu")
            for name in vb.names():
                vb.shape(name)
                mx.eval(vb.get(None, name, integer=True))
            cn.VarMap().load(path)
            outcomes["ok"] += 1
        except cn.CandleNNError:
            outcomes["rejected"] += 1
        except BaseException as exc:
            print(f"mutation {i}: {type(exc).__name__}: {exc}", file=sys.stderr)
            sys.exit(3)
        os.remove(path)
    print(outcomes["ok"], outcomes["rejected"])
""")


def test_random_mutations_only_raise_candle_nn_errors(tmp_path):
    n = 200
    proc = subprocess.run(
        [sys.executable, "-c", FUZZ_SCRIPT, VALID.hex(), str(tmp_path), str(n)],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
        env=_env_with_root(),
    )
    assert proc.returncode == 0, (
        f"fuzz subprocess failed with code {proc.returncode} (negative: killed by a signal)\n"
        f"{proc.stderr[-3000:]}"
    )
    ok, rejected = map(int, proc.stdout.split())
    assert ok + rejected == n
    assert rejected > n // 2, "the mutations should break most files"


def test_special_files_are_rejected_without_hanging(tmp_path):
    """A FIFO used to block ``safe_open`` forever; device files are not weights files either."""
    fifo = tmp_path / "weights.safetensors"
    os.mkfifo(fifo)
    code = ("import sys, candle_nn as cn\n"
            "for p in sys.argv[1:]:\n"
            "    try:\n        cn.VarBuilder.from_safetensors(p)\n"
            "    except cn.WeightsFileError as e:\n        print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(fifo), "/dev/null"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=_env_with_root())
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all("not a regular file" in line for line in lines), lines
