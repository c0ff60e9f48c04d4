"""benchmarks/bench_gpu_trace.py's trace arithmetic, on a Kineto trace written in the test."""

from __future__ import annotations

import json

from benchmarks.gpu_trace import analyse


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


def test_host_time_stops_the_clock_before_waiting_for_the_gpu():
    import time

    from benchmarks.gpu_trace import host_ms

    waited = []

    def enqueue():
        time.sleep(0.01)  # "launching"
        return lambda: (time.sleep(0.05), waited.append(1))  # "the GPU", after the clock stops

    ms = host_ms(enqueue, iters=3)
    assert len(waited) == 3 and 10 <= ms < 45, ms


def test_report_turns_a_traced_bench_run_into_profile_rows_and_a_table():
    from benchmarks.bench_gpu_trace import bench_rows, markdown

    stats = {"kernels": 100.0, "kernel_sum_ms": 0.5, "busy_ms": 0.5, "host_ms": 0.8,
             "categories": {"conv/cudnn": 0.7, "triton (fused)": 0.3},
             "top": [{"name": "sm90_xmma_fprop", "ms": 0.35, "share": 0.7, "calls": 20.0}],
             "api": []}
    report = {"results": [
        {"model": "resnet50", "dtype": "float16", "impl": "torch.compile(reduce-overhead)",
         "status": "ok", "median_ms": 1.0, "batch": 32, "batch_median_ms": 4.0,
         "trace": {"bs1": stats, "batch": {**stats, "busy_ms": 3.0}}},
        {"model": "resnet50", "dtype": "float16", "impl": "torch", "status": "error"},
        {"model": "resnet50", "dtype": "float16", "impl": "candle_nn", "status": "ok",
         "median_ms": 2.0, "batch": 32, "batch_median_ms": 5.0},  # measured without the trace
    ]}
    rows = bench_rows(report)
    assert [(r["batch"], r["wall_ms"], r["busy_ms"]) for r in rows] == [(1, 1.0, 0.5),
                                                                         (32, 4.0, 3.0)]
    table = markdown(rows).splitlines()
    assert len(table) == 4
    assert table[2].startswith("| resnet50 | float16 | 1 | torch.compile(reduce-overhead) "
                               "| 1.00 | 0.50 | 50% | 0.80 | 100 |")
    assert "conv/cudnn 70%" in table[2] and "`sm90_xmma_fprop` 70%" in table[2]
    assert "| 25% |" in table[3]  # idle = 1 - 3.0 / 4.0


def test_torch_peer_traces_host_time_when_asked():
    """--trace: the row carries the trace, with the host time, at both batches
    (a tiny PyTorch model on the CPU: the code path the GPU run takes, without a GPU)."""
    import torch

    from benchmarks import bench_peers
    from benchmarks.bench_models import BenchModel
    from benchmarks.bench_timing import Options

    tiny = BenchModel("tiny", (8, 8), 2, None, lambda vb: None,
                      lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()))
    row = bench_peers.run_torch(tiny, "cpu", "float32", Options.quick(trace=True))
    assert row["status"] == "ok", row
    for key in ("bs1", "batch"):
        assert row["trace"][key]["host_ms"] > 0 and "busy_ms" in row["trace"][key], row["trace"]


def test_report_of_a_missing_or_foreign_file_is_one_error_line(capsys, tmp_path):
    from benchmarks.bench_gpu_trace import main

    not_json, foreign = tmp_path / "garbage.json", tmp_path / "list.json"
    not_json.write_text("garbage")
    foreign.write_text("[1, 2]")
    for path in (tmp_path / "missing.json", not_json, foreign):
        assert main(["--report", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err), err
    assert "missing.json" in err[0] and "garbage.json" in err[1]
    assert "list.json" in err[2] and "--json" in err[2]
