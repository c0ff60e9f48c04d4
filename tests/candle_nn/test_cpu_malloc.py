"""glibc's malloc keeps large freed blocks for reuse (candle_nn/cpu_malloc.py), unless
``CANDLE_NN_CPU_MALLOC=os``: checked in fresh interpreters through glibc's own statistics."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest
from conftest import ROOT

# A 64 MiB MLX array evaluated on the CPU, then glibc's count of mmapped bytes (mallinfo2's
# hblkhd) while it lives, and candle_nn's status.
_PROBE = """
import ctypes, json
import candle_nn as cn
import mlx.core as mx
from candle_nn import cpu_malloc

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
with mx.stream(mx.cpu):
    x = mx.zeros((16 << 20,)) + 1.0
    mx.eval(x)
print(json.dumps({"mmapped": libc.mallinfo2().hblkhd, "status": cpu_malloc.status().as_dict(),
                  "info": str(cn.info())}))
"""


def _probe(**env: str) -> dict:
    full_env = {k: v for k, v in os.environ.items() if k != "CANDLE_NN_CPU_MALLOC"} | env
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="glibc's mallopt only")
def test_large_arrays_come_from_the_heap_unless_told_otherwise() -> None:
    reuse = _probe()
    assert reuse["status"]["state"] == "reuse", reuse
    assert reuse["mmapped"] < 64 << 20, reuse  # the array is a heap block, kept after free
    assert "CPU malloc: reuse" in reuse["info"]
    default = _probe(CANDLE_NN_CPU_MALLOC="os")
    assert default["status"]["state"] == "os", default
    assert default["mmapped"] >= 64 << 20, default  # glibc's own choice: an mmap
    assert "CPU malloc: os" in default["info"]
