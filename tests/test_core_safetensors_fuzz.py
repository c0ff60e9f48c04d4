"""Malformed safetensors files give CandleNNError (WeightsFileError), never a crash, a hang or
another exception type, from ``VarBuilder.from_safetensors``, ``vb.get`` and ``VarMap.load``.

The files are loaded in a subprocess with a timeout (``python test_core_safetensors_fuzz.py
DIR``), so a crash or hang of the native reader fails these tests instead of killing pytest. The
worker prints one JSON line per file; the tests below check each line.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TIMEOUT_S = 120

# -- a small valid file --------------------------------------------------------------------------
DATA = (np.arange(6, dtype=np.float32).tobytes() + np.arange(4, dtype=np.float16).tobytes()
        + b"\x80\x3f\x00\x40"  # bfloat16 [1, 2]
        + np.array([7], np.int64).tobytes())
HEADER = {
    "__metadata__": {"format": "mlx", "note": "fuzz"},
    "a.weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
    "b.weight": {"dtype": "F16", "shape": [4], "data_offsets": [24, 32]},
    "c.bias": {"dtype": "BF16", "shape": [2], "data_offsets": [32, 36]},
    "d.ids": {"dtype": "I64", "shape": [1], "data_offsets": [36, 44]},
}


def pack(header: "dict | bytes", data: bytes = DATA, length: int | None = None) -> bytes:
    """``u64 header length`` + header JSON (padded to 8 bytes with spaces) + data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


VALID = pack(HEADER)


def with_entry(name: str, **changes) -> dict:
    header = json.loads(json.dumps(HEADER))
    header[name].update(changes)
    return header


def raw_header(text: str) -> bytes:
    return pack(text.encode("latin-1"))


# Files that must be rejected with a CandleNNError.
BAD: dict[str, bytes] = {
    "empty": b"",
    "seven_bytes": VALID[:7],
    "seven_zero_bytes": b"\x00" * 7,
    "header_len_zero": struct.pack("<Q", 0) + VALID[8:],
    "header_len_past_eof": pack(HEADER, length=len(VALID)),
    "header_len_2_62": pack(HEADER, length=2**62),
    "header_len_max_u64": pack(HEADER, length=2**64 - 1),
    "header_len_1": pack(HEADER, length=1),
    "invalid_json": raw_header('{"a.weight": {"dtype": "F32",'),
    "json_list": raw_header("[1, 2, 3]"),
    "json_string": raw_header('"weights"'),
    "json_null": raw_header("null"),
    "entry_not_object": raw_header('{"a": 5}'),
    "non_utf8_name": pack(b'{"a.\xff\xfeweight": {"dtype": "F32", "shape": [2, 3], '
                          b'"data_offsets": [0, 24]}}', DATA[:24]),
    "non_utf8_metadata": pack(b'{"__metadata__": {"k": "\xc3\x28"}, "a": {"dtype": "F32", '
                              b'"shape": [2, 3], "data_offsets": [0, 24]}}', DATA[:24]),
    "metadata_not_strings": pack({"__metadata__": {"k": 1}, "a": HEADER["a.weight"]}, DATA[:24]),
    "dtype_unknown": pack(with_entry("a.weight", dtype="F128")),
    "dtype_lowercase": pack(with_entry("a.weight", dtype="f32")),
    "dtype_empty": pack(with_entry("a.weight", dtype="")),
    "dtype_number": pack(with_entry("a.weight", dtype=4)),
    "dtype_missing": pack({k: ({kk: vv for kk, vv in v.items() if kk != "dtype"}
                               if k == "a.weight" else v) for k, v in HEADER.items()}),
    "offsets_past_data": pack(with_entry("d.ids", data_offsets=[36, 1000])),
    "offsets_reversed": pack(with_entry("a.weight", data_offsets=[24, 0])),
    "offsets_overlap": pack(with_entry("b.weight", data_offsets=[16, 24])),
    "offsets_gap": pack(with_entry("b.weight", data_offsets=[26, 34])),
    "offsets_vs_shape": pack(with_entry("a.weight", data_offsets=[0, 20])),
    "offsets_negative": pack(with_entry("a.weight", data_offsets=[-24, 0])),
    "offsets_three": pack(with_entry("a.weight", data_offsets=[0, 12, 24])),
    "offsets_float": pack(with_entry("a.weight", data_offsets=[0.0, 24.0])),
    "offsets_huge": pack(with_entry("d.ids", data_offsets=[36, 2**64 - 1])),
    "offsets_missing": pack({k: ({kk: vv for kk, vv in v.items() if kk != "data_offsets"}
                                 if k == "a.weight" else v) for k, v in HEADER.items()}),
    "shape_negative": pack(with_entry("a.weight", shape=[-2, -3])),
    "shape_huge": pack(with_entry("a.weight", shape=[2**40, 2**40])),
    "shape_overflow_u64": pack(with_entry("a.weight", shape=[2**32, 2**32, 16])),
    "shape_max_u64": pack(with_entry("a.weight", shape=[2**64 - 1, 2])),
    "shape_too_big_for_u64": pack(with_entry("a.weight", shape=[2**70])),
    "shape_string": pack(with_entry("a.weight", shape="2x3")),
    "shape_wrong_product": pack(with_entry("a.weight", shape=[3, 3])),
    "data_missing": pack(HEADER, b""),
    "data_short": pack(HEADER, DATA[:-1]),
    "data_long": pack(HEADER, DATA + b"\x00" * 8),
}
# Truncated at many offsets: in the length, the header and the data.
BAD.update({f"truncated_at_{n}": VALID[:n] for n in range(0, len(VALID), 3)})

# Files that must load (the reference outcome for the mutations).
GOOD: dict[str, bytes] = {
    "valid": VALID,
    "valid_unpadded": (struct.pack("<Q", len(json.dumps(HEADER))) + json.dumps(HEADER).encode()
                       + DATA),
    "valid_no_metadata": pack({k: v for k, v in HEADER.items() if k != "__metadata__"}),
    "valid_zero_size": pack({"z": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]}}, b""),
}

# Odd but arguably well-formed files: loading them or raising a CandleNNError are both fine.
DUPLICATE = ('{"c.bias": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
             '"c.bias": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}')
ODD: dict[str, bytes] = {
    "duplicate_name": pack(DUPLICATE.encode(), DATA[32:36]),
    "unicode_name": pack({"wéight.δ": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}},
                         DATA[24:32]),
    "header_nul_padding": pack(json.dumps(HEADER).encode() + b"\0" * 8),
}

N_MUTATIONS = 200
WHAT = ("VarBuilder", "VarMap.load")  # the two readers every file goes through


def mutations(seed: int = 1234, count: int = N_MUTATIONS) -> dict[str, bytes]:
    """Random byte edits of VALID: flips, overwrites, insertions, deletions, mostly in the
    length and header (edits of the data alone only change values)."""
    r = np.random.default_rng(seed)
    header_end = 8 + struct.unpack("<Q", VALID[:8])[0]
    out = {}
    for i in range(count):
        buf = bytearray(VALID)
        for _ in range(int(r.integers(1, 5))):
            pos = int(r.integers(0, header_end if r.random() < 0.85 else len(buf)))
            pos = min(pos, len(buf) - 1)
            op = r.integers(0, 5)
            if op == 0:
                buf[pos] ^= 1 << int(r.integers(0, 8))
            elif op == 1:
                buf[pos] = int(r.integers(0, 256))
            elif op == 2:
                buf.insert(pos, int(r.choice([0x22, 0x7B, 0x7D, 0x2C, 0x30, 0xFF, 0x5B])))
            elif op == 3:
                del buf[pos]
            else:
                buf[pos:pos + 1] = bytes(r.choice([0x39, 0x2D, 0x80], size=int(r.integers(1, 4))))
        out[f"mutation_{i:03d}"] = bytes(buf)
    return out


# -- worker (runs in the subprocess) -------------------------------------------------------------
def _probe(path: str) -> dict[str, str]:
    import candle_nn as cn  # before mlx: candle_nn preloads its CPU BLAS  # isort: skip
    import mlx.core as mx

    outcome = {}
    for what in WHAT:
        try:
            if what == "VarBuilder":
                vb = cn.VarBuilder.from_safetensors(path)
                for name in vb.names():
                    vb.shape(name)
                    mx.eval(vb.get(None, name))
                    vb.pp("x").contains(name)
            else:
                varmap = cn.VarMap()
                varmap.load(path)
                mx.eval(list(varmap.all_vars().values()))
            outcome[what] = "ok"
        except cn.CandleNNError as exc:
            outcome[what] = f"error {type(exc).__name__}: {exc}"
        except BaseException as exc:  # noqa: BLE001 - reported as a leak
            outcome[what] = f"leak {type(exc).__name__}: {exc}"
    return outcome


def _worker(folder: str) -> None:
    files = {**GOOD, **BAD, **ODD, **mutations()}
    for name, content in files.items():
        path = Path(folder) / f"{name}.safetensors"
        path.write_bytes(content)
        print(json.dumps({"start": name}), flush=True)  # the last line names a crash's culprit
        print(json.dumps({"case": name, **_probe(str(path))}), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's candle_nn
    _worker(sys.argv[1])


# -- tests ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[str, str]]:
    folder = tmp_path_factory.mktemp("fuzz")
    try:
        proc = subprocess.run([sys.executable, __file__, str(folder)], capture_output=True,
                              text=True, timeout=TIMEOUT_S, cwd=Path(__file__).parent.parent)
    except subprocess.TimeoutExpired as exc:
        last = (exc.stdout or b"").decode(errors="replace").strip().splitlines()[-1:]
        pytest.fail(f"loading the malformed files hung (> {TIMEOUT_S} s) at {last}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0:
        pytest.fail(f"the loader crashed (exit {proc.returncode}) at {lines[-1:]}:\n"
                    f"{proc.stderr[-3000:]}")
    return {line["case"]: line for line in lines if "case" in line}


def test_every_file_was_probed(outcomes):
    assert len(outcomes) == len(GOOD) + len(BAD) + len(ODD) + N_MUTATIONS


@pytest.mark.parametrize("case", list(GOOD))
def test_valid_files_load(outcomes, case):
    assert outcomes[case]["VarBuilder"] == "ok" and outcomes[case]["VarMap.load"] == "ok"


@pytest.mark.parametrize("case", list(BAD))
def test_malformed_file_raises_weights_file_error(outcomes, case):
    for what in WHAT:
        result = outcomes[case][what]
        assert result.startswith("error WeightsFileError: "), f"{what}: {result}"
        assert f"{case}.safetensors" in result, f"{what}: the message must name the file: {result}"


@pytest.mark.parametrize("case", list(ODD))
def test_odd_file_loads_or_raises_weights_file_error(outcomes, case):
    for what in WHAT:
        result = outcomes[case][what]
        assert result == "ok" or result.startswith("error WeightsFileError: "), f"{what}: {result}"


def test_random_mutations_load_or_raise_candle_nn_errors(outcomes):
    results = [outcomes[f"mutation_{i:03d}"] for i in range(N_MUTATIONS)]
    leaks = [(i, what, r[what]) for i, r in enumerate(results) for what in WHAT
             if not (r[what] == "ok" or r[what].startswith("error "))]
    assert not leaks, leaks[:5]
    # the mutations are not all trivially fine: most break the file
    broken = sum(r["VarBuilder"] != "ok" for r in results)
    assert broken > N_MUTATIONS // 2, broken


def test_the_valid_file_really_is_valid(tmp_path):
    """Sanity check of the file every mutation starts from: it loads with the right values."""
    import candle_nn as cn

    path = tmp_path / "v.safetensors"
    path.write_bytes(VALID)
    vb = cn.VarBuilder.from_safetensors(path)
    np.testing.assert_array_equal(np.array(vb.get((2, 3), "a.weight")),
                                  np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(np.array(vb.get((4,), "b.weight")), np.arange(4))
    np.testing.assert_array_equal(np.array(vb.get((2,), "c.bias")), [1.0, 2.0])
    assert int(vb.get((1,), "d.ids")[0]) == 7
    assert vb.metadata == {"format": "mlx", "note": "fuzz"}
