"""``inspect FILE``: what a safetensors file holds and which model/variant it fits.

Only the header is read (names, shapes, dtypes, metadata); tensors are never loaded. Each model
family and variant is compared with its expected table (:mod:`candle_nn_models.weights.spec`): a
file *fits* when every tensor the model reads is present with the right shape and it holds no
other tensor than those the model knowingly leaves unread (MobileSAM's unused classification head,
BatchNorm ``num_batches_tracked``, a headless ResNet's ``fc``): the rule the models' ``load``
applies (``VarBuilder.check_all_read``), so a file that fits is a file that loads.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from candle_nn import CandleNNError, WeightsFileError, open_safetensors
from candle_nn.cli import printable

from .metadata import WeightsMetadata
from .spec import SPECS, ModelUnavailableError, Shape, expected_tensors, knowingly_unread, spec

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U8": 1, "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class TensorInfo:
    shape: Shape
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES.get(self.dtype, 4)


@dataclass
class Match:
    """How one model/variant compares with the file."""

    model: str
    variant: str
    counts: dict[str, int | None]
    expected: int
    missing: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, Shape, Shape]] = field(default_factory=list)  # name, file, model
    extra: list[str] = field(default_factory=list)  # tensors the model would refuse
    unused: list[str] = field(default_factory=list)  # tensors the model knowingly leaves

    @property
    def fits(self) -> bool:
        return not self.missing and not self.mismatched and not self.extra

    @property
    def matched(self) -> int:
        return self.expected - len(self.missing) - len(self.mismatched)

    @property
    def score(self) -> tuple[float, int]:
        return (self.matched / max(self.expected, 1), -len(self.extra) - len(self.unused))

    def label(self) -> str:
        """e.g. ``yolo_v8_pose n (17 keypoints, 1 class)``."""
        counts = ", ".join(_count_words(arg, n) for arg, n in self.counts.items())
        return f"{self.model} {self.variant}" + (f" ({counts})" if counts else "")


def _count_words(arg: str, n: int | None) -> str:
    if n is None:
        return "headless"
    noun = {"num_classes": ("class", "classes"), "num_keypoints": ("keypoint", "keypoints"),
            "num_masks": ("mask", "masks")}.get(
        arg, (arg, arg))
    return f"{n} {noun[0] if n == 1 else noun[1]}"


@dataclass
class InspectReport:
    """A file's header and how every model/variant compares with it, best first.

    ``requested``: the ``(model, variant)`` the caller asked about (``None`` parts: any).
    """

    path: Path
    tensors: dict[str, TensorInfo]
    metadata: WeightsMetadata
    raw_metadata: dict[str, str]
    matches: list[Match]
    unavailable: dict[str, str]
    requested: tuple[str | None, str | None] = (None, None)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def best(self) -> Match | None:
        """The closest model/variant of all (fits first, then the most matching tensors)."""
        return self.matches[0] if self.matches else None

    @property
    def candidates(self) -> list[Match]:
        """The matches of the requested model/variant (all when none was requested)."""
        model, variant = self.requested
        return [m for m in self.matches
                if model in (None, m.model) and variant in (None, m.variant)]

    @property
    def fitting(self) -> list[Match]:
        """Requested models/variants that the file fits, best first."""
        return [m for m in self.candidates if m.fits]


def read_header(path: "str | os.PathLike") -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """``(name -> TensorInfo, metadata)`` from a safetensors header; WeightsFileError if bad."""
    handle = open_safetensors(os.fspath(path))
    try:
        tensors = {}
        for name in handle.keys():
            sl = handle.get_slice(name)
            tensors[name] = TensorInfo(tuple(int(d) for d in sl.get_shape()), str(sl.get_dtype()))
        return tensors, dict(handle.metadata() or {})
    except Exception as exc:
        raise WeightsFileError(f"{path}: unreadable safetensors header ({exc})") from exc


def compare(shapes: dict[str, Shape], model: str, variant: str) -> Match:
    """Compare a file's ``name -> shape`` with what ``model``/``variant`` reads (with the class
    and keypoint counts the file implies)."""
    counts = SPECS[model].counts_from(shapes)
    expected = expected_tensors(model, variant, **counts)
    match = Match(model, variant, counts, len(expected))
    for name, want in expected.items():
        if name not in shapes:
            match.missing.append(name)
        elif tuple(shapes[name]) != tuple(want):
            match.mismatched.append((name, tuple(shapes[name]), tuple(want)))
    known = knowingly_unread(model, variant, **counts)
    for name in shapes:
        if name not in expected:
            (match.unused if known(name) else match.extra).append(name)
    return match


def inspect_file(path: "str | os.PathLike", model: str | None = None,
                 variant: str | None = None) -> InspectReport:
    """Read the header of ``path`` and compare it with every model/variant (or only ``model``)."""
    if variant is not None and model is None:
        raise CandleNNError(f"variant {variant!r} without a model: give the model too")
    if model is not None:
        spec(model, variant)  # CandleNNError for an unknown model or variant
    if Path(path).suffix.lower() in (".pt", ".pth", ".bin", ".ckpt"):
        raise WeightsFileError(
            f"{path} looks like a PyTorch checkpoint; inspect reads .safetensors files. Convert "
            "it first: candle-nn-weights convert --from torchvision|timm|ultralytics|mobile_sam "
            f"{path} OUT.safetensors")
    tensors, raw = read_header(path)
    shapes = {n: t.shape for n, t in tensors.items()}
    matches: list[Match] = []
    unavailable: dict[str, str] = {}
    for family in SPECS.values():
        for v in family.variants:
            try:
                matches.append(compare(shapes, family.model, v))
            except ModelUnavailableError as exc:
                unavailable[family.model] = str(exc)
                break
    meta = WeightsMetadata.from_dict(raw)
    # Best first: the most matching tensors, then the model the file's metadata names, then the
    # fewest unused tensors (a pose file also fits the plain detector, which ignores cv4).
    matches.sort(key=lambda m: (m.score[0], m.model == meta.model, m.score[1]), reverse=True)
    return InspectReport(Path(path), tensors, meta, raw, matches, unavailable, (model, variant))


def _list(names: list[str], limit: int) -> str:
    shown = ", ".join(printable(n) for n in names[:limit])
    return shown + (f", … ({len(names) - limit} more)" if len(names) > limit else "")


def _differences(m: Match, limit: int) -> list[str]:
    lines = []
    if m.missing:
        lines.append(f"  missing ({len(m.missing)}): {_list(m.missing, limit)}")
    for name, got, want in m.mismatched[:limit]:
        lines.append(f"  shape mismatch: {printable(name)} is {list(got)}, the model expects "
                     f"{list(want)}")
    if len(m.mismatched) > limit:
        lines.append(f"  … {len(m.mismatched) - limit} more shape mismatches")
    if m.extra:
        lines.append(f"  extra, which {m.model} {m.variant} does not read ({len(m.extra)}): "
                     f"{_list(m.extra, limit)}")
    return lines


def format_report(report: InspectReport, *, show_tensors: bool = True, limit: int = 12) -> str:
    """Human-readable text of an InspectReport."""
    lines = [f"{report.path}: {len(report.tensors)} tensors, "
             f"{report.total_bytes / 2**20:.1f} MiB"]
    dtypes: dict[str, int] = {}
    for t in report.tensors.values():
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + 1
    lines.append("dtypes: " + ", ".join(f"{d} x{n}" for d, n in sorted(dtypes.items())))
    for key, value in sorted(report.raw_metadata.items()):
        shown_value = value if len(value) < 200 else value[:200] + "…"
        lines.append(f"metadata {printable(key)} = {printable(shown_value)}")
    if show_tensors:
        width = max((len(printable(n)) for n in report.tensors), default=0)
        for name, t in sorted(report.tensors.items()):
            lines.append(f"  {printable(name):<{width}}  {t.dtype:<4} {list(t.shape)}")
    fits = report.fitting
    for m in fits:
        extra = (f"; {len(m.unused)} extra tensors not used: {_list(m.unused, limit)}"
                 if m.unused else "")
        lines.append(f"fits: {m.label()}: all {m.expected} tensors{extra}")
    if not fits:
        closest = report.candidates[0] if report.candidates else None
        model, variant = report.requested
        wanted = " ".join(p for p in (model, variant) if p) or "any known model"
        if closest is None:
            lines.append(f"fits no model: {wanted} could not be checked")
        elif closest.matched == 0:
            lines.append(f"does not fit {wanted}: none of its tensor names and shapes are "
                         f"those of {'a known model' if model is None else model}")
        else:
            lines.append(f"does not fit {wanted}. Closest: {closest.label()}, "
                         f"{closest.matched}/{closest.expected} tensors match")
            lines.extend(_differences(closest, limit))
        best = report.best
        if best is not None and best is not closest and best.matched:
            lines.append(f"it looks like: {best.label()}"
                         + (" (fits)" if best.fits else
                            f", {best.matched}/{best.expected} tensors match"))
    for model, why in report.unavailable.items():
        lines.append(f"not checked: {model} ({why})")
    return "\n".join(lines)
