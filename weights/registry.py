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
from typing import Callable

from candle_nn import WeightsFileError, check_weights_path, open_safetensors

from .metadata import TASKS
from .spec import SPECS, tensor_count


class WeightsUnavailableError(WeightsFileError):
    """The default weights could not be obtained (offline, no huggingface_hub, unknown variant)."""


@dataclass(frozen=True)
class Checkpoint:
    """One published checkpoint: which model/variant it holds and where it lives on the hub."""

    model: str
    variant: str
    repo_id: str
    filename: str

    @property
    def tensors(self) -> int:
        """How many tensors our model reads from it (a file with fewer is truncated or the wrong
        file), counted by building the model (:func:`weights.spec.tensor_count`)."""
        return tensor_count(self.model, self.variant)

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


# Where candle publishes each model's files: hub repository and variant -> file name (None: no
# published file for that variant). The variants themselves come from weights.spec.SPECS.
_HUB_FILES: dict[str, tuple[str, Callable[[str], str | None]]] = {
    "resnet": ("lmz/candle-resnet", lambda v: f"{v}.safetensors"),
    "yolo_v8": ("lmz/candle-yolo-v8", lambda v: f"yolov8{v}.safetensors"),
    "yolo_v8_pose": ("lmz/candle-yolo-v8", lambda v: f"yolov8{v}-pose.safetensors"),
    "mobile_sam": ("lmz/candle-sam", lambda v: f"mobile_sam-{v}-vitt.safetensors"),
    "sam": ("lmz/candle-sam", {"vit_b": "sam_vit_b_01ec64.safetensors"}.get),
}


def _table() -> dict[tuple[str, str], Checkpoint]:
    rows = [Checkpoint(model, variant, repo_id, filename)
            for model, (repo_id, file_of) in _HUB_FILES.items()
            for variant in SPECS[model].variants if (filename := file_of(variant)) is not None]
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
        published = sorted(v for m, v in CHECKPOINTS if m == model)
        if variant in SPECS[model].variants:
            raise WeightsUnavailableError(
                f"candle publishes no {model} {variant} checkpoint (published: "
                f"{', '.join(published)}); pass its weights with --weights PATH.safetensors"
            ) from None
        raise WeightsUnavailableError(
            f"no published checkpoint for {model} variant {variant!r}; known variants: "
            f"{', '.join(sorted(SPECS[model].variants))}. Pass --weights PATH.safetensors for "
            "other weights.") from None


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
    handle = open_safetensors(os.fspath(path))
    count = len(list(handle.keys()))
    if count < entry.tensors:
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
