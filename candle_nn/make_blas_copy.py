"""``python -m candle_nn.make_blas_copy [FOLDER]``: make the renamed BLAS copy (blas_copy.py) that
``import candle_nn`` binds to MLX. ``pip install`` runs it (setup.py); run it again as the
package's owner after upgrading OpenBLAS. A module of its own: candle_nn imports blas_copy.py
itself, and ``-m`` must not re-run a module that is already imported.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Make the copy for the BLAS ``import candle_nn`` would bind, in FOLDER (default
    ``blas_copy.copy_dir()``); prints its path."""
    from . import blas
    from .blas_copy import CopyError, renamed_copy

    argv = sys.argv[1:] if argv is None else argv
    plan = blas.copy_plan()
    if plan is None:
        print("candle_nn.make_blas_copy: nothing to copy (no optimized BLAS, or this MLX build "
              "does not bundle the reference one)")
        return 0
    try:
        path = renamed_copy(*plan, directory=argv[0] if argv else None)
    except CopyError as exc:
        print(f"candle_nn.make_blas_copy: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
