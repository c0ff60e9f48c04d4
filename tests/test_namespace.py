"""One import namespace (issue 12 item 4): installing the package adds only `candle_nn` and
`candle_nn_models` (the repository's models/, with weights/ and scripts/ as its .weights and
.scripts, mapped in pyproject.toml); benchmarks/ and tests/ are never installed.

The wheel is built here, installed with ``pip --target`` (no dependencies: this venv's MLX,
NumPy, ... serve) and used from a user's folder that has its own ``models``, ``weights`` and
``scripts`` packages: the README's Python snippets and its first command run there, and the
user's packages stay the ones Python imports.
"""

from __future__ import annotations

import ast
import configparser
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT

NAMES = {"candle_nn", "candle_nn_models"}
# the repository's folders that used to be installed as top-level packages, and the harness
OLD = ("models", "weights", "scripts")
NOT_INSTALLED = ("benchmarks", "tests")
MAPPED = {"candle_nn": "candle_nn", "models": "candle_nn_models",
          "weights": "candle_nn_models/weights", "scripts": "candle_nn_models/scripts"}
SOURCES = ["candle_nn", *OLD, "benchmarks", "tests"]


def _python_files() -> list[Path]:
    return sorted(p for folder in SOURCES for p in (ROOT / folder).rglob("*.py"))


def _old_name(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in OLD


def _module_strings(tree: ast.AST) -> list[str]:
    """String constants that name a module: 'pkg.mod', 'pkg.mod:func', or the argument of
    import_module / find_spec / resources.files / `python -m`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if (name in ("import_module", "find_spec", "files")
                    and isinstance(node.args[0].value, str)):
                found.append(node.args[0].value)
        if isinstance(node, (ast.List, ast.Tuple)):  # ["python", "-m", "pkg.mod"]
            items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            found += [b for a, b in zip(items, items[1:]) if a == "-m" and isinstance(b, str)]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"\w+(\.\w+)+(:\w+)?", node.value):
                found.append(node.value.split(":")[0])
    return found


def test_nothing_imports_the_old_top_level_names() -> None:
    """No `import models|weights|scripts` (they exist only in a checkout, never installed): code,
    tests and the benchmark use candle_nn_models.*, as a user does."""
    bad = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), str(path))
        rel = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bad += [f"{rel}:{node.lineno}: import {a.name}" for a in node.names
                        if _old_name(a.name)]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and _old_name(node.module):
                bad.append(f"{rel}:{node.lineno}: from {node.module} import ...")
        bad += [f"{rel}: module name {s!r}" for s in _module_strings(tree)
                if _old_name(s) and _is_module(s)]
    assert not bad, "\n".join(bad)


def test_the_installed_package_never_imports_the_benchmark() -> None:
    """benchmarks/ is a repository tool (python -m benchmarks): installed code must not need it."""
    bad = []
    for folder in ("candle_nn", *OLD):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and not node.level
                         else [])
                bad += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names
                        if n and n.split(".")[0] in NOT_INSTALLED]
    assert not bad, bad


def _is_module(dotted: str) -> bool:
    """Whether 'models.x.y' is a module path of this repository (not e.g. a file 'weights.pt')."""
    parts = dotted.split(".")
    base = ROOT.joinpath(*parts)
    return base.is_dir() or base.with_suffix(".py").is_file() or len(parts) == 1


def test_readme_and_entry_points_use_the_installed_names() -> None:
    texts = {p: p.read_text() for p in (ROOT / "README.md", ROOT / "weights" / "README.md")}
    for path, text in texts.items():
        for block in re.findall(r"```(?:python|bash)\n(.*?)```", text, flags=re.S):
            old_import = rf"^\s*(from|import)\s+({'|'.join(OLD)})\b"
            assert not re.search(old_import, block, flags=re.M), path
            assert not re.search(rf"-m\s+({'|'.join(OLD)})\.", block), path
    pyproject = (ROOT / "pyproject.toml").read_text()
    scripts = re.search(r"^\[project\.scripts\]\n(.*?)^\[", pyproject, flags=re.S | re.M).group(1)
    targets = re.findall(r'=\s*"([\w.]+):\w+"', scripts)
    assert targets and all(t.split(".")[0] == "candle_nn_models" for t in targets), targets


def test_the_editable_install_adds_only_the_two_names(tmp_path) -> None:
    """This venv's `pip install -e .` (setuptools' import finder, not a path entry for the
    repository): outside the checkout only candle_nn and candle_nn_models import from it. A
    top-level package of another name's owner (the H100 image's site-packages holds a `scripts`
    package of its own) may import; it must not be one of this checkout's folders."""
    probe = textwrap.dedent("""
        import importlib.util, json
        import candle_nn_models.weights, candle_nn_models.scripts

        def where(name):
            spec = importlib.util.find_spec(name)
            return None if spec is None else [p for p in [spec.origin,
                                              *(spec.submodule_search_locations or [])] if p]

        print(json.dumps({"found": {n: where(n) for n in %r},
                          "weights": candle_nn_models.weights.__file__}))
    """ % [*NAMES, *OLD, *NOT_INSTALLED])
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert all(out["found"][n] for n in NAMES), out
    from_checkout = {n: [p for p in out["found"][n] or [] if Path(p).resolve().is_relative_to(ROOT)]
                     for n in [*NAMES, *OLD, *NOT_INSTALLED]}
    assert {n: bool(paths) for n, paths in from_checkout.items()} == {
        n: n in NAMES for n in [*NAMES, *OLD, *NOT_INSTALLED]}, out
    assert Path(out["weights"]) == ROOT / "weights" / "__init__.py"


def _env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["CANDLE_NN_FIXTURES"] = str(FIXTURES)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the checkout (no build/ or egg-info left in the tree)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".*", "build", "dist", "*.egg-info", "__pycache__", "out"))
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation,
                           "-w", str(tmp / "dist"), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (built,) = (tmp / "dist").glob("*.whl")
    return built


def _dist_info(names: list[str], file: str) -> str:
    (path,) = [n for n in names if re.fullmatch(rf"[^/]+\.dist-info/{file}", n)]
    return path


def test_the_wheel_holds_only_the_two_names_and_every_module(wheel) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top_level = set(zf.read(_dist_info(names, "top_level.txt")).decode().split())
        record = zf.read(_dist_info(names, "RECORD")).decode().splitlines()
        entry_points = configparser.ConfigParser()
        entry_points.read_string(zf.read(_dist_info(names, "entry_points.txt")).decode())
    assert top_level == NAMES
    tops = {line.split(",")[0].split("/")[0] for line in record if line}
    assert {t for t in tops if not t.endswith(".dist-info")} == NAMES, tops
    for folder, installed in MAPPED.items():  # the explicit package list misses no module
        for py in (ROOT / folder).rglob("*.py"):
            rel = py.relative_to(ROOT / folder).as_posix()
            assert f"{installed}/{rel}" in names, f"{folder}/{rel} is not in the wheel"
    for data in (ROOT / "models" / "data").glob("*.txt"):
        assert f"candle_nn_models/data/{data.name}" in names
    scripts = dict(entry_points["console_scripts"])
    pyproject = (ROOT / "pyproject.toml").read_text()
    declared = re.search(r"^\[project\.scripts\]\n(.*?)^\[", pyproject, flags=re.S | re.M).group(1)
    assert set(scripts) == set(re.findall(r"^([\w-]+) =", declared, flags=re.M))
    assert {"candle-resnet", "candle-nn-weights"} <= set(scripts)
    assert "candle-nn-bench" not in scripts  # the harness is not installed: python -m benchmarks
    assert all(t.startswith("candle_nn_models.") for t in scripts.values()), scripts


USER_PACKAGE = 'MARK = "the user\'s own {name}"\n'
PRELUDE = textwrap.dedent("""
    import numpy as np
    import candle_nn as cn
    import mlx.core as mx
    vb = cn.VarBuilder.from_varmap(cn.VarMap(), seed=0, device="cpu")  # random weights
    rgb_uint8 = np.random.default_rng(0).integers(0, 256, (120, 160, 3), dtype=np.uint8)
    x = mx.random.normal((1, 64, 64, 3), key=mx.random.key(0))
""")


def test_the_wheel_beside_a_user_folder_with_its_own_models(wheel, tmp_path) -> None:
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                           "--target", str(site), str(wheel)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {p.name for p in site.iterdir() if not p.name.endswith(".dist-info")} >= NAMES
    assert not {p.name for p in site.iterdir()} & {*OLD, *NOT_INSTALLED}

    user = tmp_path / "project"
    for name in OLD:
        (user / name).mkdir(parents=True)
        (user / name / "__init__.py").write_text(USER_PACKAGE.format(name=name))
    readme = (ROOT / "README.md").read_text()
    snippets = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert len(snippets) >= 4
    runner = [PRELUDE]
    for i, snippet in enumerate(snippets):
        # as written, except the automatic mask generator's point grid: 4x4 instead of 32x32 runs
        # the same code with 64x fewer prompts (random weights: the masks themselves mean nothing),
        # and the fixtures' paths where the fixtures are
        snippet = re.sub(r"points_per_side=\d+", "points_per_side=4", snippet)
        snippet = snippet.replace("../shared/fixtures/", f"{FIXTURES}/")
        runner.append(f"exec(compile({snippet!r}, 'README snippet {i}', 'exec'), {{**globals()}})")
    runner.append(textwrap.dedent("""
        import sys, json, candle_nn, candle_nn_models, candle_nn_models.weights
        import models, weights, scripts
        print(json.dumps({"user": [models.MARK, weights.MARK, scripts.MARK],
                          "installed": [candle_nn.__file__, candle_nn_models.__file__,
                                        candle_nn_models.weights.__file__]}))
    """))
    (user / "readme_snippets.py").write_text("\n".join(runner))
    env = {**_env(), "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "readme_snippets.py"], cwd=user, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "(2, 10)" in proc.stdout  # the "new model in 25 lines" snippet's print
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["user"] == [USER_PACKAGE.format(name=n).split('"')[1] for n in OLD]
    assert all(Path(f).is_relative_to(site) for f in out["installed"]), out["installed"]

    # the README's first command, through the wheel's console-script target, from the user folder
    first = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)[0]
    args = first.split(".venv/bin/candle-resnet", 1)[1].split()
    args = [str(FIXTURES / a.split("../shared/fixtures/", 1)[1]) if "../shared/fixtures/" in a
            else a for a in args]
    proc = subprocess.run([sys.executable, "-c", "import sys; from candle_nn_models.scripts.resnet "
                           "import main; sys.exit(main())", *args], cwd=user, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "bearskin" in proc.stdout  # the fixture weights are random (README)
    assert (user / "models" / "__init__.py").read_text() == USER_PACKAGE.format(name="models")


# -- layering: candle_nn <- models <- weights <- task APIs <- scripts / benchmarks -----------------
# The task APIs (models/yolo/: `yolo.load(path or None)`) resolve a file by name, the published
# default through the weights registry: they sit above weights/, below the CLIs, their clients.
TASK_APIS = ("models/yolo", "models/resnet", "models/sam")
LAYERS = {"candle_nn": 0, "models": 1, "weights": 2, **dict.fromkeys(TASK_APIS, 2.5),
          "scripts": 3}
INSTALLED_AS = {"candle_nn": "candle_nn", "models": "candle_nn_models",
                "weights": "candle_nn_models.weights", "scripts": "candle_nn_models.scripts",
                **{api: "candle_nn_models." + api.split("/")[1] for api in TASK_APIS}}


def _layer_of(module: str) -> str | None:
    """The repository folder a module name belongs to (None: not ours, or the harness)."""
    for folder in ("scripts", "weights", *TASK_APIS, "models", "candle_nn"):  # longest first
        name = INSTALLED_AS[folder]
        if module == name or module.startswith(name + "."):
            return folder
    return None


def _package_of(path: Path, folder: str) -> str:
    """The installed package of a file of the repository's ``folder``."""
    return ".".join([INSTALLED_AS[folder], *path.relative_to(ROOT / folder).parent.parts])


def _imported_modules(path: Path, package: str) -> list[tuple[int, str, list[str]]]:
    """``(line, absolute module, imported names)`` of every import in ``path`` (relative ones
    resolved against its installed ``package``), including ``import_module("...")`` strings."""
    package = package.split(".")
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module, names))
            found += [(node.lineno, f"{module}.{n}", []) for n in names]  # `from pkg import mod`
        elif (isinstance(node, ast.Call) and node.args
              and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module",
                                                                              "find_spec")
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value, []))
    return found


def test_the_import_graph_is_one_way() -> None:
    """candle_nn imports nothing of the models, models nothing of weights/, the task APIs or
    scripts/, weights/ nothing of the task APIs or scripts/ (issue 14 item 3), the task APIs
    nothing of scripts/; lazy imports inside functions count too."""
    bad = []
    for folder, rank in LAYERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if any(inner != folder and inner.startswith(f"{folder}/")
                   and path.is_relative_to(ROOT / inner) for inner in LAYERS):
                continue  # a file of a nested layer (models/yolo/ in models/): checked as that
            for line, module, _ in _imported_modules(path, _package_of(path, folder)):
                target = _layer_of(module)
                if target is not None and LAYERS[target] > rank:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {folder} imports {module} "
                               f"({target})")
    assert not bad, "\n".join(bad)


def test_nothing_outside_candle_nn_imports_its_private_names() -> None:
    """models/, weights/ and scripts/ use candle_nn's public API (what they need is exported, e.g.
    TensorSource for weights/spec.py's recording VarBuilder source), never `_private` names."""
    bad = []
    for folder in ("models", "weights", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, module, names in _imported_modules(path, _package_of(path, folder)):
                if _layer_of(module) == "candle_nn":
                    private = [n for n in [*module.split("."), *names] if n.startswith("_")]
                    if private:
                        bad.append(f"{path.relative_to(ROOT)}:{line}: {module} {private}")
    assert not bad, "\n".join(bad)


def test_the_layering_check_sees_a_violation(tmp_path) -> None:
    """The checker itself: an upward import, a relative one and a lazy one are each found."""
    probe = tmp_path / "probe.py"
    probe.write_text("from .weights import spec\n"
                     "def f():\n    import candle_nn_models.scripts.common\n"
                     "import importlib\nimportlib.import_module('candle_nn_models.weights.cli')\n"
                     "from candle_nn.var_builder import _private\n")
    found = _imported_modules(probe, "candle_nn_models")  # as if it were models/probe.py
    layers = {(m, _layer_of(m)) for _, m, _ in found}
    assert ("candle_nn_models.weights.spec", "weights") in layers
    assert ("candle_nn_models.scripts.common", "scripts") in layers
    assert ("candle_nn_models.weights.cli", "weights") in layers
    assert [names for _, m, names in found if m == "candle_nn.var_builder"] == [["_private"]]
