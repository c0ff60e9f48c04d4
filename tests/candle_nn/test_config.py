"""Every ``CANDLE_NN_*`` environment variable is read in candle_nn/config.py and nowhere else
(Python read by AST, C++ by ``getenv``), and each is documented in docs/environment.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import candle_nn as cn

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "candle_nn" / "config.py"
PREFIX = "CANDLE_NN_"


def _sources(suffixes: tuple[str, ...]) -> list[Path]:
    """The project's own files: hidden folders (virtualenvs such as .venv-bench, .git) and build
    outputs are not ours."""
    skip = {"build", "node_modules"}
    return sorted(p for p in ROOT.rglob("*") if p.suffix in suffixes and p.is_file()
                  and not any(part in skip or part.startswith(".")
                              for part in p.relative_to(ROOT).parts))


def _constants(tree: ast.AST) -> dict[str, str]:
    """Module-level ``NAME = "CANDLE_NN_..."`` assignments (a name read through a constant)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str) and node.value.value.startswith(PREFIX):
            out.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return out


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
        (isinstance(node, ast.Name) and node.id == "environ")


def env_reads(path: Path) -> list[tuple[int, str]]:
    """``(line, variable)`` for each read of a ``CANDLE_NN_*`` variable in a Python file:
    ``os.environ.get(v)``, ``os.getenv(v)``, ``os.environ[v]`` (load), ``v in os.environ``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = _constants(tree)

    def var(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value
        elif isinstance(node, ast.Name):
            value = names.get(node.id, "")
        else:
            return None
        return value if value.startswith(PREFIX) else None

    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if isinstance(f, ast.Attribute) and ((f.attr in ("get", "pop") and _is_environ(f.value))
                                                 or f.attr == "getenv"):
                key = var(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and _is_environ(node.value):
            key = var(node.slice)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 \
                and isinstance(node.ops[0], (ast.In, ast.NotIn)) \
                and _is_environ(node.comparators[0]):
            key = var(node.left)
        if key:
            found.append((node.lineno, key))
    return found


def test_the_scanner_finds_each_form_of_read(tmp_path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('import os\nfrom os import environ\nVAR = "CANDLE_NN_X"\n'
                      'a = os.environ.get("CANDLE_NN_A")\nb = os.getenv(VAR)\n'
                      'c = os.environ["CANDLE_NN_C"]\nd = "CANDLE_NN_D" in environ\n'
                      'os.environ["CANDLE_NN_W"] = "1"\ne = os.environ.get("HOME")\n')
    assert env_reads(sample) == [(4, "CANDLE_NN_A"), (5, "CANDLE_NN_X"), (6, "CANDLE_NN_C"),
                                 (7, "CANDLE_NN_D")]


def test_no_candle_nn_variable_is_read_outside_the_config_module() -> None:
    reads = [f"{p.relative_to(ROOT)}:{line}: {name}" for p in _sources((".py",))
             if p != CONFIG for line, name in env_reads(p)]
    getenv = re.compile(r"getenv\(\s*\"(" + PREFIX + r"\w+)\"")
    for p in _sources((".c", ".cc", ".cpp", ".h", ".hpp", ".cu")):
        for number, text in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            reads += [f"{p.relative_to(ROOT)}:{number}: {m}" for m in getenv.findall(text)]
    assert reads == [], "read these through candle_nn.config:\n" + "\n".join(reads)
    assert "os.environ.get(" in CONFIG.read_text(encoding="utf-8")  # where they belong


def test_every_setting_is_documented_once() -> None:
    page = (ROOT / "docs" / "environment.md").read_text(encoding="utf-8")
    for setting in cn.config.SETTINGS:
        assert page.count(f"`{setting.name}`") >= 1, setting.name
    documented = set(re.findall(r"`(" + PREFIX + r"[A-Z0-9_]+)`", page))
    assert documented == {s.name for s in cn.config.SETTINGS}


def test_reload_reads_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("CANDLE_NN_CPU_THREADS", "3")
    cn.config.reload()
    try:
        assert cn.config.cpu_threads() == 3
    finally:
        monkeypatch.delenv("CANDLE_NN_CPU_THREADS")
        cn.config.reload()
    assert cn.config.cpu_threads() is None
