"""candle-nn-bench (`python -m benchmarks`) --quick on ResNet-18: structure of the table, the
JSON and the chart.

No timing assertions. Peers that are not installed in this venv (torch/torchvision, ONNX
Runtime, matplotlib) must be reported as unavailable, never as errors or failures.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json

import pytest

from benchmarks import bench

RESULT_KEYS = {"model", "input_hw", "device", "dtype", "impl", "status", "reason", "version",
               "load_s", "note"}
TIMING_KEYS = {"first_s", "median_ms", "p90_ms", "runs", "batch", "batch_median_ms",
               "throughput_ips"}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> tuple[dict, str, object]:
    """One in-process quick run of ResNet-18 on the CPU with every peer; (report, stdout, dir)."""
    out = tmp_path_factory.mktemp("bench")
    buffer = io.StringIO()  # capsys is function-scoped: capture this module-scoped run by hand
    with contextlib.redirect_stdout(buffer):
        code = bench.main(["--quick", "--models", "resnet18", "--device", "cpu", "--threads", "2",
                           "--in-process", "--json", str(out / "r.json"),
                           "--markdown", str(out / "r.md")])
    assert code == 0
    return json.loads((out / "r.json").read_text()), buffer.getvalue(), out


def test_every_implementation_is_measured_or_unavailable(quick) -> None:
    report, _, _ = quick
    rows = {r["impl"]: r for r in report["results"]}
    assert set(rows) == {"candle_nn", "torch", "onnxruntime"}
    for row in rows.values():
        assert RESULT_KEYS <= set(row), row
        assert (row["model"], row["device"], row["dtype"]) == ("resnet18", "cpu", "float32")
        assert row["status"] in ("ok", "unavailable"), row  # never "error"
        if row["status"] == "ok":
            assert TIMING_KEYS <= set(row)
            assert 0 < row["median_ms"] <= row["p90_ms"]
            assert row["batch"] == 2 and row["throughput_ips"] > 0 and row["load_s"] > 0
        else:
            assert row["reason"]
    assert rows["candle_nn"]["status"] == "ok", rows["candle_nn"]
    torch_ready = _installed("torch") and _installed("torchvision")
    assert (rows["torch"]["status"] == "ok") == torch_ready, rows["torch"]
    ort_ready = torch_ready and _installed("onnxruntime") and _installed("onnx")
    assert (rows["onnxruntime"]["status"] == "ok") == ort_ready, rows["onnxruntime"]


def test_ratios_pair_ours_with_each_measured_peer(quick) -> None:
    report, _, _ = quick
    ok = {r["impl"] for r in report["results"] if r["status"] == "ok"}
    expected = {("candle_nn", p) for p in ok - {"candle_nn"}} if "candle_nn" in ok else set()
    assert {(q["ours"], q["peer"]) for q in report["ratios"]} == expected
    for q in report["ratios"]:
        assert q["bs1"] > 0 and q["batch"] > 0


def test_meta_names_the_blas_and_the_command(quick) -> None:
    report, _, _ = quick
    meta = report["meta"]
    assert meta["quick"] and meta["options"]["threads"] == 2
    assert meta["info"]["blas"]["name"]
    assert meta["command"].startswith("python -m benchmarks --quick")
    assert set(meta["versions"]) >= {"torch", "onnxruntime"}


def test_table_lists_measurements_ratios_and_what_was_not_measured(quick) -> None:
    report, text, _ = quick
    assert "bs1 med ms" in text and "img/s" in text
    if report["ratios"]:
        assert "ratios: time ours / time theirs" in text
    for row in report["results"]:
        if row["status"] != "ok":
            assert f"{row['impl']}: {row['status']} - {row['reason']}" in text


def test_markdown_table_and_report_of_a_saved_run(quick, capsys) -> None:
    report, text, out = quick
    md = (out / "r.md").read_text().splitlines()
    assert md[0].startswith("| model | device | dtype | candle_nn bs1 ms")
    ours = [r for r in report["results"] if r["impl"] == "candle_nn" and r["status"] == "ok"]
    assert len(md) == 2 + len(ours)
    assert bench.main(["--report", str(out / "r.json")]) == 0
    assert capsys.readouterr().out.strip() == text.strip()


def test_report_merges_saved_runs_into_one(quick, tmp_path, capsys) -> None:
    """A table measured in several runs (one per model and dtype on a GPU) is merged into one
    file: the rows side by side, the ratios those of the rows together, each run's command
    kept."""
    report, _, _ = quick
    parts = []
    for i, ours in enumerate((True, False)):
        part = {**report, "meta": {**report["meta"], "command": f"run {i}"},
                "results": [r for r in report["results"] if (r["impl"] == "candle_nn") == ours]}
        parts.append(tmp_path / f"part{i}.json")
        parts[-1].write_text(json.dumps(part))
    merged = tmp_path / "merged.json"
    assert bench.main(["--report", *map(str, parts), "--json", str(merged)]) == 0
    saved = json.loads(merged.read_text())
    assert saved["results"] == report["results"] and saved["ratios"] == report["ratios"]
    assert saved["meta"]["runs"] == ["run 0", "run 1"]
    assert saved["meta"]["command"].startswith("python -m benchmarks --report ")
    capsys.readouterr()


def test_chart_is_written_when_matplotlib_is_installed(quick) -> None:
    report, _, out = quick
    measured = any(r["status"] == "ok" for r in report["results"])
    assert (out / "r.png").is_file() == (_installed("matplotlib") and measured)


def test_isolated_run_and_unknown_peer(tmp_path, capsys) -> None:
    """The default mode runs each implementation in its own process; --rounds keeps the best."""
    assert bench.main(["--quick", "--models", "resnet18", "--device", "cpu", "--peers", "none",
                       "--rounds", "2", "--json", str(tmp_path / "r.json")]) == 0
    (row,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert row["impl"] == "candle_nn" and row["status"] in ("ok", "unavailable"), row
    if row["status"] == "ok":  # best of two rounds
        rounds = row["rounds_median_ms"]
        assert len(rounds) == 2 and row["median_ms"] == min(rounds)
    with pytest.raises(SystemExit, match="unknown peer"):
        bench.main(["--quick", "--peers", "pytorch"])


def test_profile_prints_self_times_per_module(capsys) -> None:
    assert bench.main(["--profile", "--models", "resnet18", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "resnet18: forward" in text and "Conv2d" in text and "costliest modules" in text


def test_bad_paths_are_one_error_line_before_measuring(capsys, tmp_path):
    from benchmarks.bench import main as bench_main

    assert bench_main(["--report", str(tmp_path / "missing.json")]) == 1
    assert bench_main(["--quick", "--json", str(tmp_path / "no" / "dir" / "x.json")]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # --json names the results file here: no error document on stdout
    err = err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err), err
    assert "missing.json" in err[0] and "does not exist or is not writable" in err[1]


def test_device_names_use_candle_nns_parser_and_keep_absent_gpus() -> None:
    assert bench._devices("cpu,CUDA,gpu:1,metal") == ["cpu", "gpu:0", "gpu:1"]
    with pytest.raises(SystemExit, match=r"unknown device kind 'tpu'.*\(or 'all'\)"):
        bench._devices("cpu,tpu")


@pytest.mark.parametrize("choice,impls", [("only", ["candle_nn+mx.compile"]),
                                          ("on", ["candle_nn", "candle_nn+mx.compile"]),
                                          ("off", ["candle_nn"])])
def test_compile_choice_picks_our_rows(choice, impls) -> None:
    """--compile only: candle_nn under mx.compile without its eager row (a short GPU table)."""
    from benchmarks.bench_timing import Options

    args = bench._parser().parse_args(["--models", "resnet18", "--device", "cpu", "--peers",
                                       "none", "--compile", choice])
    jobs = bench._jobs(args, Options(), "/nowhere")
    assert [j["impl"] for j in jobs] == impls


def test_quick_training_rows_against_torch(tmp_path) -> None:
    """--quick training step (resnet18-train: batch 2, 64x64): ours eager and under mx.compile
    against PyTorch (torchvision's ResNet, or benchmarks/resnet_reference.py's where torchvision
    cannot load), one step-time ratio per pair."""
    assert bench.main(["--quick", "--models", "resnet18-train", "--device", "cpu", "--threads",
                       "2", "--compile", "on", "--peers", "torch,onnxruntime", "--in-process",
                       "--json", str(tmp_path / "t.json")]) == 0
    report = json.loads((tmp_path / "t.json").read_text())
    rows = {r["impl"]: r for r in report["results"]}
    assert set(rows) == {"candle_nn", "candle_nn+mx.compile", "torch"}  # no ONNX training row
    for row in rows.values():
        assert row["status"] == "ok", row
        assert (row["model"], row["input_hw"], row["batch"]) == ("resnet18-train", [64, 64], 2)
        assert row["median_ms"] == row["batch_median_ms"] > 0 and "training step" in row["note"]
    pairs = {(r["ours"], r["peer"]): r for r in report["ratios"]}
    assert set(pairs) == {("candle_nn", "torch"), ("candle_nn+mx.compile", "torch")}
    ratio = pairs[("candle_nn", "torch")]
    ours, torch_ms = rows["candle_nn"]["median_ms"], rows["torch"]["median_ms"]
    assert ratio["bs1"] == pytest.approx(ours / torch_ms)


def test_yolo_training_peer_is_ultralytics_loss_on_our_boxes() -> None:
    """yolov8n-train's PyTorch peer: ultralytics' DetectionModel and v8DetectionLoss on the
    row's seeded images and boxes; its loss equals ours (DetectionLoss) on the same weights and
    batch to float32 precision (1e-4 relative), and its SGD step changes the weights."""
    import candle_nn as cn
    import mlx.core as mx
    import torch

    from helpers.ultralytics_reference import import_ultralytics

    import_ultralytics()
    from benchmarks import bench_train
    from benchmarks.bench_models import MODELS
    from benchmarks.bench_timing import Options
    from candle_nn_models.weights.convert import convert_ultralytics
    from candle_nn_models.yolo_v8 import YoloV8

    model = MODELS["yolov8n-train"]
    step = bench_train._torch_step(model, "cpu", 2, (64, 64), Options())
    net = step.model
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    x, y = bench_train._labels(model, 2, (64, 64), 0)
    batch = {"img": torch.from_numpy(x.transpose(0, 3, 1, 2).copy()),
             "batch_idx": torch.from_numpy(y[:, 0]), "cls": torch.from_numpy(y[:, 1:2]),
             "bboxes": torch.from_numpy(y[:, 2:6])}
    want = float(net.loss(batch)[0].sum().detach())
    tensors = convert_ultralytics({k: v.numpy() for k, v in state.items()
                                   if not k.endswith("num_batches_tracked")},
                                  source="peer").tensors
    ours = YoloV8.load(cn.VarBuilder.from_tensors({k: mx.array(v) for k, v in tensors.items()}),
                       "n", num_classes=80, fold_bn=False).train()
    got = float(bench_train._loss(model)(ours, mx.array(x), mx.array(y)))
    assert got == pytest.approx(want, rel=1e-4)
    step()
    assert any(not torch.equal(state[k], v) for k, v in net.state_dict().items())


def test_torch_resnet_stand_in_is_torchvisions_network() -> None:
    """benchmarks/resnet_reference.py: torchvision's parameter count per variant (11,689,512 and
    25,557,032) and output shape."""
    import torch

    from benchmarks.resnet_reference import resnet

    for variant, count in (("resnet18", 11_689_512), ("resnet50", 25_557_032)):
        net = resnet(variant)
        assert sum(p.numel() for p in net.parameters()) == count
    assert net(torch.zeros(1, 3, 64, 64)).shape == (1, 1000)


def test_docs_training_table_is_generated_from_its_results_file() -> None:
    """docs/benchmarks.md's training table is ``bench_report.markdown`` of
    benchmarks/results/cpu-train.json, which names its machine and command."""
    from benchmarks import bench_report
    from conftest import ROOT as root

    report = bench_report.read_saved_run(str(root / "benchmarks" / "results" / "cpu-train.json"))
    assert report["meta"]["command"].startswith("python -m benchmarks --models resnet50-train")
    assert report["meta"]["machine"]
    assert {r["model"] for r in report["results"]} == {"resnet50-train"}
    assert bench_report.markdown(report) in (root / "docs" / "benchmarks.md").read_text()
