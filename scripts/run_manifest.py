"""The file list of a run folder, ``.candle-nn-outputs.json``: which files in it this project
wrote (relative path -> the input image, size and modification time). :mod:`.outputs` keeps it;
:mod:`.input_paths` reads it so that outputs are never taken as inputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

MANIFEST = ".candle-nn-outputs.json"


def read_manifest(folder: "str | os.PathLike") -> dict[str, dict]:
    """``{relative path: {"image", "size", "mtime_ns"}}`` of the files the project wrote in a run
    folder; empty when it has no (readable) list."""
    try:
        doc = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
        files = doc.get("files", {})
        return files if isinstance(files, dict) else {}
    except (OSError, ValueError, AttributeError):
        return {}
