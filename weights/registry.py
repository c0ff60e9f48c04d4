"""Known checkpoints and how a CLI gets its weights file.

:func:`resolve_weights` is what every model CLI calls: an explicit ``--weights PATH`` always wins;
otherwise the registry names candle's published file, fetched through ``huggingface_hub`` into its
normal cache. Offline, or without ``huggingface_hub``, the error says which file to get and where
to pass it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from candle_nn import WeightsFileError


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
    def url(self) -> str:
        return f"https://huggingface.co/{self.repo_id}/resolve/main/{self.filename}"


def _table() -> dict[tuple[str, str], Checkpoint]:
    rows = [Checkpoint("resnet", f"resnet{d}", "lmz/candle-resnet", f"resnet{d}.safetensors")
            for d in (18, 34, 50, 101, 152)]
    for size in "nsmlx":
        rows.append(Checkpoint("yolo_v8", size, "lmz/candle-yolo-v8", f"yolov8{size}.safetensors"))
        rows.append(Checkpoint("yolo_v8_pose", size, "lmz/candle-yolo-v8",
                               f"yolov8{size}-pose.safetensors"))
    rows.append(Checkpoint("mobile_sam", "tiny", "lmz/candle-sam", "mobile_sam-tiny-vitt.safetensors"))
    rows.append(Checkpoint("sam", "vit_b", "lmz/candle-sam", "sam_vit_b_01ec64.safetensors"))
    return {(r.model, r.variant): r for r in rows}


CHECKPOINTS: dict[tuple[str, str], Checkpoint] = _table()


def checkpoint(model: str, variant: str) -> Checkpoint:
    """The registry entry for ``(model, variant)``; WeightsUnavailableError when unknown."""
    try:
        return CHECKPOINTS[(model, variant)]
    except KeyError:
        known = sorted(v for m, v in CHECKPOINTS if m == model)
        raise WeightsUnavailableError(
            f"no published checkpoint for {model} variant {variant!r}"
            + (f"; known variants: {', '.join(known)}" if known else "")
            + ". Pass --weights PATH.safetensors."
        ) from None


def resolve_weights(model: str, variant: str, path: "str | Path | None" = None) -> Path:
    """The weights file to load: ``path`` when given (must exist), else the hub download.

    Args:
        model: ``"resnet"``, ``"yolo_v8"``, ``"yolo_v8_pose"``, ``"mobile_sam"`` or ``"sam"``.
        variant: e.g. ``"resnet18"``, ``"n"``, ``"tiny"``.
        path: an explicit file (``--weights``); always wins.
    """
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise WeightsFileError(f"weights file not found: {p}")
        return p
    entry = checkpoint(model, variant)
    how = (f"Download {entry.filename} from {entry.url} and pass it with --weights PATH "
           "(or convert your own checkpoint with `candle-nn-weights convert`).")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise WeightsUnavailableError(
            f"huggingface_hub is not installed, so {entry.filename} cannot be downloaded "
            f"(pip install 'candle-nn-mlx[hub]'). {how}") from None
    try:
        return Path(hf_hub_download(entry.repo_id, entry.filename))
    except Exception as exc:  # offline, HTTP errors, missing cache: all mean "not available"
        raise WeightsUnavailableError(
            f"cannot download {entry.repo_id}/{entry.filename} ({type(exc).__name__}). {how}"
        ) from exc
