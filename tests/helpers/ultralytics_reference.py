"""ultralytics itself (PyPI ``ultralytics``, pinned in the README's test command) as the tests'
reference for YOLO models, losses and metrics: :func:`import_ultralytics` imports it here.

ultralytics depends on torchvision, but PyPI's torchvision is built against CUDA torch and cannot
load next to the CPU torch wheel of the ``test`` extra, so the test command installs ultralytics
with ``--no-deps`` (every other dependency it imports is in the ``test`` extra). At import,
ultralytics only reads torchvision's *version* (``importlib.metadata.version("torchvision")``);
it calls torchvision's NMS only when torchvision is already in ``sys.modules`` and otherwise
uses its own torch NMS. So where torchvision is absent, a metadata finder answers that one
question with the release the test extra's torch pairs with, and nothing of torchvision is
imported. Its settings file goes to a temporary folder, never the user's home.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import tempfile
import types

from candle_nn_models.scripts.common import environment_restored

# torch 2.13's torchvision (ultralytics' check_torchvision: torch 2.x pairs with 0.(x + 15))
TORCHVISION_STAND_IN_VERSION = "0.28.0"


class _TorchvisionMetadata(importlib.metadata.Distribution):
    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return ("Metadata-Version: 2.1\nName: torchvision\n"
                    f"Version: {TORCHVISION_STAND_IN_VERSION}\n")
        return None

    def locate_file(self, path):  # a distribution with no files
        return None


class _TorchvisionMetadataFinder(importlib.metadata.DistributionFinder):
    """Finds only the metadata above, only for the name ``torchvision``; imports nothing."""

    def find_spec(self, *args, **kwargs):
        return None

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        if context.name in ("torchvision",):
            yield _TorchvisionMetadata()


# What import_ultralytics leaves set in os.environ: ultralytics reads both when imported.
KEPT_ENVIRONMENT = ("YOLO_CONFIG_DIR", "YOLO_OFFLINE")


def import_ultralytics() -> types.ModuleType:
    """``ultralytics``, with torchvision's version answered where torchvision is not installed;
    raises ``ImportError`` (naming the README's test command) when ultralytics is missing.

    The process is left as it was but for :data:`KEPT_ENVIRONMENT`: importing ultralytics sets
    ``OMP_NUM_THREADS=1`` (and ``NUMEXPR_MAX_THREADS``, log levels; OpenCV ``LD_LIBRARY_PATH``)
    in os.environ and replaces ``PIL.Image.open`` (with one that, on a file Pillow cannot
    identify, checks for and may install ``pi-heif``, logging to the stream of whichever test
    imported it) and ``torch.save``; all of that would otherwise reach every later test of the
    session, and the CLIs run in it."""
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="ultralytics-settings-"))
    os.environ.setdefault("YOLO_OFFLINE", "1")
    try:
        importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        if not any(isinstance(f, _TorchvisionMetadataFinder) for f in sys.meta_path):
            sys.meta_path.append(_TorchvisionMetadataFinder())
    import torch
    from PIL import Image

    patched = [(Image, "open", Image.open), (torch, "save", torch.save)]
    try:
        with environment_restored():
            return importlib.import_module("ultralytics")
    except ModuleNotFoundError as e:
        if e.name != "ultralytics":
            raise
        raise ImportError(
            "ultralytics is the reference of these tests: install it as the README's test command "
            "does (`.venv/bin/pip install --no-deps ultralytics==8.4.190`)") from e
    finally:
        for owner, name, original in patched:
            setattr(owner, name, original)
