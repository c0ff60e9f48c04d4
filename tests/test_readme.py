"""The README's promises: its snippet runs, and CI runs exactly its test command."""

from __future__ import annotations

import re
import runpy

from conftest import FIXTURES, ROOT

README = (ROOT / "README.md").read_text()


def _code_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_readme_opens_with_the_two_commands() -> None:
    bash = _code_blocks("bash")
    assert len(bash) >= 2
    assert "candle-" in bash[0] and "pip install" in bash[0]
    assert "pytest" in bash[1] and "pip install" in bash[1]


def test_ci_runs_the_readme_test_command() -> None:
    test_command = _code_blocks("bash")[1].strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci.splitlines(), \
        "the README's test command must appear verbatim in .ci/run"


def test_readme_snippet_runs(tmp_path, monkeypatch, capsys) -> None:
    snippet = _code_blocks("python")[0]
    assert len(snippet.strip().splitlines()) < 30
    script = tmp_path / "snippet.py"
    script.write_text(snippet)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    assert (tmp_path / "tiny.safetensors").is_file()
    assert "(2, 10)" in capsys.readouterr().out


def test_readme_says_the_fixture_weights_are_random_and_shows_candles_published_ones() -> None:
    intro = README.split("Set up and run the tests:")[0]
    assert "weights are random" in intro and "bearskin" in intro
    first = _code_blocks("bash")[0]
    published = re.search(r"`(\.venv/bin/candle-resnet [^`]*)`", intro.split(first)[1])
    assert published, "the one-line equivalent with candle's published weights"
    assert "--weights" not in published.group(1)  # no --weights: candle's checkpoint from the hub


def test_huggingface_hub_is_a_regular_dependency() -> None:
    """The default weights are the normal path: a plain `pip install` must bring the downloader."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    dependencies = re.search(r"^dependencies = \[(.*?)^\]", pyproject, flags=re.S | re.M).group(1)
    assert re.search(r'^\s*"huggingface_hub>=', dependencies, flags=re.M)


def test_no_unresolved_merge_conflict_markers_in_tracked_text() -> None:
    """A merge left `<<<<<<< HEAD` blocks in the README once; no tracked file may carry them.
    Outside a git checkout (a copy of the tree, as on the GPU machine, or no `git` there) every
    file of the source folders and the top-level text files is read instead."""
    import subprocess

    try:
        tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        folders = ("candle_nn", "models", "weights", "scripts", "benchmarks", "tests", ".ci")
        tracked = [str(p.relative_to(ROOT)) for folder in folders
                   for p in sorted((ROOT / folder).rglob("*")) if "__pycache__" not in p.parts]
        tracked += [p.name for p in ROOT.iterdir() if p.is_file()]
    assert "README.md" in tracked and "tests/test_readme.py" in tracked, tracked[:20]
    marker = re.compile(r"^(<{7} |>{7} |={7}$)", flags=re.M)
    found = []
    for name in tracked:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".toml", ".txt", ".cpp", ".h", ".cfg", ""} \
                or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        found += [f"{name}: {m.group(0)!r}" for m in marker.finditer(text)]
    assert not found, "unresolved merge conflict markers: " + "; ".join(found)


def test_the_results_tables_are_generated_from_the_results_files() -> None:
    """Each results table in the README (the AMG and AVX-512 ones: docs/benchmarks.md) is
    ``bench_report.markdown`` of a JSON run in benchmarks/results/ (regenerate: ``python -m
    benchmarks --report FILE --markdown OUT``), and each file names its machine and command."""
    from benchmarks import bench_report

    benchmarks_page = (ROOT / "docs" / "benchmarks.md").read_text()
    for name, page in (("cpu.json", README), ("h100.json", README), ("amg.json", benchmarks_page),
                       ("cpu-avx512.json", benchmarks_page)):
        path = ROOT / "benchmarks" / "results" / name
        report = bench_report.read_saved_run(str(path))
        assert report["meta"]["command"].startswith("python -m benchmarks ")
        assert report["meta"]["machine"]
        assert bench_report.markdown(report) in page, name


def test_the_gpu_profile_table_is_generated_from_the_results_file() -> None:
    """docs/nvidia.md's profile table is ``bench_gpu_trace``'s Markdown of the kernel traces in
    benchmarks/results/h100.json (``python -m benchmarks.bench_gpu_trace --report FILE``)."""
    from benchmarks import bench_gpu_trace, bench_report

    report = bench_report.read_saved_run(str(ROOT / "benchmarks" / "results" / "h100.json"))
    rows = bench_gpu_trace.bench_rows(report)
    assert {row["side"] for row in rows} == {"candle_nn+mx.compile", "torch",
                                            "torch.compile(reduce-overhead)"}
    assert bench_gpu_trace.markdown(rows) in (ROOT / "docs" / "nvidia.md").read_text()


def test_no_history_in_the_readme_and_docs() -> None:
    """History lives in commits: no commit hashes, dates, times, load averages or "tried and
    reverted" notes in the README or docs/."""
    texts = {"README.md": README}
    texts.update({str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "docs").glob("*.md")})
    patterns = [r"(?<![-\w./])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![-\w])",
                r"\b20\d\d-\d\d-\d\d\b", r"\bUTC\b", r"load average", r"\bZen \d", r"reverted",
                r"\bcommit [0-9a-f]{7}"]
    found = [f"{name}: {m.group(0)!r}" for name, text in texts.items() for pattern in patterns
             for m in re.finditer(pattern, text)]
    assert found == [], found
    assert len(README.splitlines()) <= 310


def _snippet(marker: str) -> str:
    found = [b for b in _code_blocks("python") if marker in b]
    assert len(found) == 1, f"one README snippet with {marker!r}"
    return found[0]


def test_readme_training_snippet_runs(tmp_path, monkeypatch, capsys) -> None:
    """The training loop: fold_bn=False, value_and_grad, an MLX optimizer, save_safetensors; the
    saved file reloads folded and gives the trained model's eval outputs (1e-5)."""
    import mlx.core as mx

    import candle_nn as cn
    from candle_nn_models.resnet import ResNet

    monkeypatch.chdir(tmp_path)
    scope = runpy.run_path(_write(tmp_path, _snippet("fold_bn=False")), run_name="__main__")
    assert "loss " in capsys.readouterr().out
    trained = scope["model"]
    reloaded = ResNet.load(cn.VarBuilder.from_safetensors(tmp_path / "trained.safetensors",
                                                          device="cpu"), "resnet18", num_classes=4)
    x = scope["x"]
    ref = trained.eval()(x)
    assert float(mx.abs(reloaded(x) - ref).max()) <= 1e-5 * max(float(mx.abs(ref).max()), 1.0)


def test_readme_fast_path_snippet_runs(tmp_path, capsys) -> None:
    runpy.run_path(_write(tmp_path, _snippet("cn.ops.disabled")), run_name="__main__")
    assert "winograd" in capsys.readouterr().out


def test_readme_yolo_api_snippet_runs(tmp_path, monkeypatch, capsys) -> None:
    """The YOLO task API snippet, its ``../shared/fixtures/`` paths (the README's first command's)
    where the fixtures are: a path and an array give two Results, the path's record names it and
    its drawing has the image's size."""
    snippet = _snippet("from candle_nn_models import yolo")
    monkeypatch.chdir(tmp_path)
    scope = runpy.run_path(_write(tmp_path, snippet.replace("../shared/fixtures/",
                                                            f"{FIXTURES}/")), run_name="__main__")
    assert len(scope["results"]) == 2 and scope["record"]["image"].endswith("bike.jpg")
    assert scope["record"]["detections"] and scope["drawing"].shape == (556, 800, 3)
    assert "[[" in capsys.readouterr().out  # the boxes printed


def _api_lines(marker: str, network: str) -> str:
    """The task API's lines of the snippet with ``marker`` (those before the network's
    ``network`` import, which needs a ``vb``), the fixtures' paths where the fixtures are, the
    automatic masks' grid 4x4 (the same code, 64x fewer prompts)."""
    lines = _snippet(marker).split(network)[0]
    return re.sub(r"points_per_side=\d+", "points_per_side=4",
                  lines.replace("../shared/fixtures/", f"{FIXTURES}/"))


def test_readme_resnet_api_snippet_runs(tmp_path, monkeypatch, capsys) -> None:
    """The ResNet task API lines: the printed record is ``candle-resnet --json``'s for the bike
    (3 labels), and the API gives the path's 1000 probabilities."""
    import json

    from candle_nn_models.scripts.resnet import main as resnet_cli

    monkeypatch.chdir(tmp_path)
    snippet = _api_lines("from candle_nn_models import resnet", "from candle_nn_models.resnet ")
    scope = runpy.run_path(_write(tmp_path, snippet), run_name="__main__")
    r = scope["r"]
    assert r.probs.shape == (1000,) and len(r.top_k) == 3 and r.path.name == "bike.jpg"
    assert str(r.to_json()) in capsys.readouterr().out
    assert resnet_cli(["--image", str(r.path), "--weights", str(scope["model"].path), "--top-k",
                       "3", "--json", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == [r.to_json()]


def test_readme_sam_api_snippet_runs(tmp_path, monkeypatch, capsys) -> None:
    """The SAM task API lines: three masks of the bike's size with their scores, and automatic
    masks from a 4x4 grid."""
    monkeypatch.chdir(tmp_path)
    snippet = _api_lines("from candle_nn_models import sam", "from candle_nn_models.segment_")
    scope = runpy.run_path(_write(tmp_path, snippet), run_name="__main__")
    r, auto = scope["r"], scope["auto"]
    assert r.masks.shape == (3, 556, 800) and r.scores.shape == (3,) and 0 <= r.best < 3
    assert "(3, 556, 800)" in capsys.readouterr().out
    assert auto.points == 16 and auto.to_json()["mode"] == "everything"
    assert auto.masks.shape == (len(auto.records), 556, 800)


def _write(tmp_path, snippet: str) -> str:
    script = tmp_path / "snippet.py"
    script.write_text(snippet)
    return str(script)
