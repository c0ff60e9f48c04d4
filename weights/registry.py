"""Known checkpoints and how a CLI gets its weights file.

:func:`resolve_weights` is what every model CLI calls: an explicit ``--weights PATH`` always wins;
otherwise the registry names candle's published file, fetched through ``huggingface_hub`` into its
normal cache. Offline, or without ``huggingface_hub``, the error says which file to get and where
to pass it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from candle_nn import WeightsFileError
from candle_nn.var_builder import check_weights_path

from .metadata import TASKS


class WeightsUnavailableError(WeightsFileError):
    """The default weights could not be obtained (offline, no huggingface_hub, unknown variant)."""


@dataclass(frozen=True)
class Checkpoint:
    """One published checkpoint: which model/variant it holds and where it lives on the hub.

    ``tensors`` is the number of tensors our model reads from it (a file with fewer is truncated
    or the wrong file); ``None`` when we have no model to check it against.
    """

    model: str
    variant: str
    repo_id: str
    filename: str
    tensors: int | None = None

    @property
    def url(self) -> str:
        return f"https://huggingface.co/{self.repo_id}/resolve/main/{self.filename}"

    @property
    def task(self) -> str:
        return TASKS[self.model]

    def how_to_get(self) -> str:
        """The sentence telling a user how to provide this file by hand."""
        return (f"Download {self.filename} from {self.url} and pass it with --weights PATH "
                f"(or, once online, run `candle-nn-weights download {self.model} {self.variant}`; "
                "or convert your own checkpoint with `candle-nn-weights convert`).")


# Tensor counts: what models/* read from candle's files (tests/test_weights_registry.py checks
# them against the models). ResNet: torchvision names incl. BatchNorm running stats.
_RESNET_TENSORS = {18: 102, 34: 182, 50: 267, 101: 522, 152: 777}
_YOLO_TENSORS = {"n": 298, "s": 298, "m": 398, "l": 498, "x": 498}
_POSE_EXTRA = 36  # head.cv4: three branches of two conv-BN (5 tensors each) + a conv (2)


def _table() -> dict[tuple[str, str], Checkpoint]:
    rows = [Checkpoint("resnet", f"resnet{d}", "lmz/candle-resnet", f"resnet{d}.safetensors",
                       _RESNET_TENSORS[d]) for d in (18, 34, 50, 101, 152)]
    for size in "nsmlx":
        rows.append(Checkpoint("yolo_v8", size, "lmz/candle-yolo-v8", f"yolov8{size}.safetensors",
                               _YOLO_TENSORS[size]))
        rows.append(Checkpoint("yolo_v8_pose", size, "lmz/candle-yolo-v8",
                               f"yolov8{size}-pose.safetensors", _YOLO_TENSORS[size] + _POSE_EXTRA))
    rows.append(Checkpoint("mobile_sam", "tiny", "lmz/candle-sam",
                           "mobile_sam-tiny-vitt.safetensors", 408))
    rows.append(Checkpoint("sam", "vit_b", "lmz/candle-sam", "sam_vit_b_01ec64.safetensors", 314))
    return {(r.model, r.variant): r for r in rows}


CHECKPOINTS: dict[tuple[str, str], Checkpoint] = _table()


def checkpoint(model: str, variant: str) -> Checkpoint:
    """The registry entry for ``(model, variant)``; WeightsUnavailableError when unknown."""
    try:
        return CHECKPOINTS[(model, variant)]
    except KeyError:
        models = sorted({m for m, _ in CHECKPOINTS})
        if model not in models:
            raise WeightsUnavailableError(
                f"unknown model {model!r}; known models: {', '.join(models)}. "
                "See `candle-nn-weights list`.") from None
        known = sorted(v for m, v in CHECKPOINTS if m == model)
        raise WeightsUnavailableError(
            f"no published checkpoint for {model} variant {variant!r}; known variants: "
            f"{', '.join(known)}. Pass --weights PATH.safetensors for other weights."
        ) from None


def download(model: str, variant: str, *, force: bool = False) -> Path:
    """Fetch candle's published checkpoint into the huggingface_hub cache (with its progress
    bars) and return its path; a cached copy is reused unless ``force``.

    The file's header is checked (parses, holds at least the expected number of tensors).
    Raises WeightsUnavailableError (unknown entry, no huggingface_hub, offline, HTTP error) or
    WeightsFileError (the file is not the expected checkpoint).
    """
    entry = checkpoint(model, variant)
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise WeightsUnavailableError(
            f"huggingface_hub is not installed, so {entry.filename} cannot be downloaded "
            f"(pip install huggingface_hub: candle-nn-mlx depends on it). {entry.how_to_get()}"
        ) from None
    try:
        if not force:  # a cached copy needs no network at all
            try:
                return _checked(entry, Path(hf_hub_download(entry.repo_id, entry.filename,
                                                            local_files_only=True)))
            except WeightsFileError:
                raise
            except Exception:
                pass
        _check_hub_reachable()
        with _quiet_hub_retries():
            path = Path(hf_hub_download(entry.repo_id, entry.filename, force_download=force))
    except WeightsFileError:
        raise
    except Exception as exc:  # offline, HTTP errors, missing cache: all mean "not available"
        raise WeightsUnavailableError(
            f"cannot download {entry.repo_id}/{entry.filename} ({_why(exc)}). {entry.how_to_get()}"
        ) from exc
    return _checked(entry, path)


def _checked(entry: Checkpoint, path: Path) -> Path:
    _check_download(entry, path)
    return path


class _HubUnreachable(Exception):
    """The hub's host name does not resolve: fail at once instead of huggingface_hub's retries."""


def _check_hub_reachable() -> None:
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return  # a proxy resolves names for us
    from urllib.parse import urlparse

    from huggingface_hub import constants

    host = urlparse(getattr(constants, "ENDPOINT", "https://huggingface.co")).hostname
    if host:
        try:
            socket.getaddrinfo(host, 443)
        except OSError as exc:
            raise _HubUnreachable(f"{host} cannot be resolved: no network?") from exc


@contextlib.contextmanager
def _quiet_hub_retries():
    """Hide huggingface_hub's per-retry log lines; its final error is reported as one line."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _why(exc: Exception) -> str:
    from huggingface_hub import constants

    offline = getattr(constants, "HF_HUB_OFFLINE", False) or os.environ.get(
        "HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    if offline:
        return "offline mode (HF_HUB_OFFLINE) is on and the file is not in the cache"
    if type(exc).__name__ == "LocalEntryNotFoundError":
        return "the Hub cannot be reached and the file is not in the cache"
    if isinstance(exc, _HubUnreachable):
        return str(exc)
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _check_download(entry: Checkpoint, path: Path) -> None:
    from candle_nn.var_builder import open_safetensors

    handle = open_safetensors(os.fspath(path))
    count = len(list(handle.keys()))
    if entry.tensors is not None and count < entry.tensors:
        raise WeightsFileError(
            f"{path} holds {count} tensors, {entry.model} {entry.variant} needs {entry.tensors}: "
            f"the download is incomplete or not the right file. Run `candle-nn-weights download "
            f"{entry.model} {entry.variant} --force`, or {entry.how_to_get()}")


def resolve_weights(model: str, variant: str, path: "str | Path | None" = None) -> Path:
    """The weights file to load: ``path`` when given (must exist), else the hub download.

    Args:
        model: ``"resnet"``, ``"yolo_v8"``, ``"yolo_v8_pose"``, ``"mobile_sam"`` or ``"sam"``.
        variant: e.g. ``"resnet18"``, ``"n"``, ``"tiny"``.
        path: an explicit file (``--weights``); always wins.
    """
    if path is not None:
        return Path(check_weights_path(path))
    return download(model, variant)
