"""scripts/bench_gpu_trace.py's trace arithmetic, on a Kineto trace written in the test."""

from __future__ import annotations

import json

from scripts.bench_gpu_trace import analyse


def test_busy_time_is_the_union_of_gpu_intervals_per_forward(tmp_path):
    events = [  # two forwards: overlapping kernels, a copy, a gap, runtime calls (not GPU time)
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_fprop_implicit_gemm", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "mlx::core::cu::copy_g", "ts": 5, "dur": 10},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": 100, "dur": 4},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_fprop_implicit_gemm", "ts": 200, "dur": 6},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 3},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 190, "dur": 3},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    stats = analyse(str(path), iters=2)
    assert stats["kernels"] == 1.5  # 3 kernels over 2 forwards; the memcpy is no launch
    assert abs(stats["busy_ms"] - (15 + 4 + 6) / 2 / 1e3) < 1e-12
    assert abs(stats["kernel_sum_ms"] - (10 + 10 + 4 + 6) / 2 / 1e3) < 1e-12
    assert stats["top"][0]["name"] == "sm90_xmma_fprop_implicit_gemm"
    assert stats["top"][0]["calls"] == 1.0
    assert stats["categories"]["conv/cudnn"] == round(16 / 30, 3)
    assert stats["api"][0] == {"name": "cudaLaunchKernel", "ms": 0.003, "calls": 1.0}
