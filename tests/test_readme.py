"""The README's promises: its snippet runs, and CI runs exactly its test command."""

from __future__ import annotations

import re
import runpy

from conftest import ROOT

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
