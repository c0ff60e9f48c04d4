"""candle-nn-bench's ``mobilesam-amg`` entry (benchmarks/bench_amg.py): both generators on the same
weights, each in its own process, on a small grid (``--amg-points``) to stay fast.

No timing assertions: the rows, the mask counts (the same weights and image give the same number
of masks on both sides) and the ratio must be there.
"""

from __future__ import annotations

import contextlib
import io
import json
import types

import pytest

from benchmarks import bench


def test_amg_rows_mask_counts_and_ratio(tmp_path) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = bench.main(["--models", "mobilesam-amg", "--device", "cpu", "--threads", "2",
                           "--amg-points", "3", "--repeat", "1", "--json",
                           str(tmp_path / "amg.json")])
    assert code == 0
    report = json.loads((tmp_path / "amg.json").read_text())
    rows = {r["impl"]: r for r in report["results"]}
    assert set(rows) == {"candle_nn", "torch"}  # a pipeline: no ONNX / compiled rows
    for row in rows.values():  # the test extra has torch and mobilesam-mirror: both must run
        assert row["status"] == "ok", row
        assert (row["batch"], row["runs"], row["dtype"]) == (1, 1, "float32")
        assert row["median_ms"] > 0 and "3x3 points, image 800x556" in row["note"]
        assert "fixture mobile_sam" in row["note"]
    assert rows["candle_nn"]["masks"] == rows["torch"]["masks"]
    assert rows["candle_nn"]["output"] == f"{rows['torch']['masks']} masks"
    (ratio,) = report["ratios"]
    assert (ratio["ours"], ratio["peer"]) == ("candle_nn", "torch") and ratio["bs1"] > 0
    assert "outputs:\n  mobilesam-amg cpu float32 candle_nn:" in out.getvalue()
    assert report["meta"]["options"]["amg_points"] == 3


def test_amg_profile_splits_the_pipeline(capsys) -> None:
    assert bench.main(["--profile", "--models", "mobilesam-amg", "--device", "cpu",
                       "--amg-points", "2"]) == 0
    text = capsys.readouterr().out
    assert "mobilesam-amg: one image 800x556, 2x2 points" in text
    for stage in ("image encoder", "decoder: prompt tokens, IoUs (every prompt)",
                  "decoder: output upscaling (kept prompts)", "other"):
        assert stage in text, text


def test_bad_amg_points() -> None:
    with pytest.raises(SystemExit, match="--amg-points must be at least 1"):
        bench.main(["--models", "mobilesam-amg", "--amg-points", "0"])


@pytest.mark.parametrize("repeat, durations, figures", [
    # the cold call (kernel compilation on a GPU) is first_s; the median is over the later calls,
    # one of them at least even though the cold call alone outlasted the 15 s budget
    (5, [30.0, 0.5, 0.7, 0.6], {"first_s": 30.0, "median_ms": 500.0, "runs": 1}),
    (3, [2.0, 0.5, 0.7, 0.6], {"first_s": 2.0, "median_ms": 600.0, "runs": 2}),
    # --repeat 1 (a CPU run of minutes per call): that one call is the median
    (1, [30.0, 0.5], {"first_s": 30.0, "median_ms": 30000.0, "runs": 1}),
])
def test_pipeline_timing_keeps_the_cold_call_out_of_the_median(monkeypatch, repeat, durations,
                                                               figures) -> None:
    """time_pipeline's arithmetic on a fake clock (each call advances it by its duration)."""
    from benchmarks import bench_timing

    clock = {"now": 0.0}
    calls = iter(durations)
    fake_time = types.SimpleNamespace(perf_counter=lambda: clock["now"])
    monkeypatch.setattr(bench_timing, "time", fake_time)

    def call() -> None:
        clock["now"] += next(calls)

    got = bench_timing.time_pipeline(call, bench_timing.Options(repeat=repeat, budget_s=15.0))
    assert {k: got[k] for k in figures} == pytest.approx(figures)
    assert got["batch"] == 1 and got["batch_median_ms"] == got["median_ms"]
