"""Builds candle_nn's C++ extension ``candle_nn._cpu_kernels`` (fused multithreaded CPU kernels as
MLX primitives, see candle_nn/cpu_native.py) with CMake, through MLX's own extension helper.

Everything else about the package is in pyproject.toml. The extension is optional: if it cannot
be built (no C++ compiler or CMake), ``pip install`` still succeeds, the reason is written next
to where the module would be (``_cpu_kernels.build-error.txt``) and candle_nn uses its pure-MLX
paths; ``python -m candle_nn`` says which.

The same step makes the renamed copy of the optimized BLAS that candle_nn binds to MLX
(``python -m candle_nn.make_blas_copy``, into ``candle_nn/_blas/``), so that importing candle_nn
writes nothing; where it cannot (no OpenBLAS, no patchelf), the install still succeeds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup

EXT_NAME = "candle_nn._cpu_kernels"
SOURCES = Path(__file__).resolve().parent / "candle_nn" / "csrc"
ERROR_FILE = "_cpu_kernels.build-error.txt"
BLAS_DIR = "_blas"  # candle_nn/blas_copy.py's copy_dir()


def _make_blas_copy(out_dir: Path) -> None:
    """The renamed BLAS copy into ``out_dir / BLAS_DIR`` (see candle_nn/blas_copy.py); a failure
    is a warning (candle_nn then makes it at its first import, or says how)."""
    env = {**os.environ, "CANDLE_NN_BLAS": "off"}  # the build's own import binds nothing
    command = [sys.executable, "-m", "candle_nn.make_blas_copy", str(out_dir / BLAS_DIR)]
    done = subprocess.run(command, cwd=Path(__file__).resolve().parent, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        print(f"WARNING: the BLAS copy was not made: {done.stderr.strip()[-500:]}",
              file=sys.stderr)


def _cmdclass() -> dict:
    try:
        from mlx.extension import CMakeBuild
    except ImportError:  # no MLX in the build environment: nothing to build against
        return {}

    class OptionalCMakeBuild(CMakeBuild):
        """MLX's CMakeBuild, with Ninja when it is there and a failed build reported, not fatal."""

        def build_extension(self, ext) -> None:
            out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
            out_dir.mkdir(parents=True, exist_ok=True)
            error_file = out_dir / ERROR_FILE
            error_file.unlink(missing_ok=True)
            if shutil.which("ninja") and "CMAKE_GENERATOR" not in os.environ:
                os.environ["CMAKE_GENERATOR"] = "Ninja"
            try:
                super().build_extension(ext)
            except (OSError, subprocess.CalledProcessError) as exc:
                reason = f"the C++ extension {ext.name} was not built ({exc})"
                print(f"WARNING: {reason}; candle_nn will use its pure-MLX CPU paths",
                      file=sys.stderr)
                error_file.write_text(reason + "\n", encoding="utf-8")
            _make_blas_copy(out_dir)

        def copy_extensions_to_source(self) -> None:
            # editable installs: the module (or the error note) and the BLAS copy go next to
            # candle_nn's sources, from where build_extension wrote them (the build folder)
            build_py = self.get_finalized_command("build_py")
            package_dir = Path(build_py.get_package_dir("candle_nn")).resolve()
            for ext in self.extensions:
                module = Path(self.get_ext_fullpath(ext.name)).name
                built_dir = (Path(self.build_lib) / "candle_nn").resolve()
                if built_dir == package_dir:
                    continue
                for name in (module, ERROR_FILE):
                    (package_dir / name).unlink(missing_ok=True)
                    if (built_dir / name).exists():
                        shutil.copy2(built_dir / name, package_dir / name)
                if (built_dir / BLAS_DIR).is_dir():
                    shutil.copytree(built_dir / BLAS_DIR, package_dir / BLAS_DIR,
                                    dirs_exist_ok=True)

    return {"build_ext": OptionalCMakeBuild}


def _ext_modules() -> list:
    try:
        from mlx.extension import CMakeExtension
    except ImportError:
        return []
    return [CMakeExtension(EXT_NAME, sourcedir=str(SOURCES))]


setup(ext_modules=_ext_modules(), cmdclass=_cmdclass())
