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
    assert test_command in ci.splitlines(), "the README's test command must appear verbatim in .ci/run"


def test_readme_snippet_runs(tmp_path, monkeypatch, capsys) -> None:
    snippet = _code_blocks("python")[0]
    assert len(snippet.strip().splitlines()) < 30
    script = tmp_path / "snippet.py"
    script.write_text(snippet)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    assert (tmp_path / "tiny.safetensors").is_file()
    assert "(2, 10)" in capsys.readouterr().out
