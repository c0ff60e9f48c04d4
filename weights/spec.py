"""The registered models: what each model/variant is built from and reads from a weights file.

:data:`SPECS` lists every model family with its variants, taken from the models' own config tables
(``candle_nn_models.resnet_network.VARIANTS``, ``candle_nn_models.yolo_v8.MULTIPLES``,
``candle_nn_models.yolo11.SCALES``,
``candle_nn_models.segment_anything.TINY_VIT_CONFIGS`` / ``VIT_CONFIGS``), and :func:`build_model`
builds one from a VarBuilder. The registry of published files
(``candle_nn_models.weights.registry``), ``inspect``, ``convert`` and the CLIs take their
model/variant names from here.

The expected ``name -> shape`` table (:func:`expected_tensors`) is not written down anywhere
either: it is recorded by building the model through a :class:`RecordingSource`, a VarBuilder
source that hands out free, lazy zero tensors of the requested shape and writes down every name
and shape asked for. So it always agrees with the models' ``load`` code (candle's names).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Mapping

from candle_nn import CandleNNError, Device, Module, TensorSource, VarBuilder
import mlx.core as mx

from candle_nn_models.resnet_network import VARIANTS as RESNET_VARIANTS
from candle_nn_models.resnet_network import ResNet
from candle_nn_models.segment_anything import MOBILE_SAM_ENCODERS, VIT_CONFIGS, Sam
from candle_nn_models.yolo11 import SCALES as YOLO11_SCALES
from candle_nn_models.yolo11 import Yolo11, Yolo11Cls, Yolo11Pose, Yolo11Seg
from candle_nn_models.yolo_v8 import MULTIPLES, YoloV8, YoloV8Cls, YoloV8Pose, YoloV8Seg

Shape = tuple[int, ...]


class RecordingSource(TensorSource):
    """A VarBuilder source that returns zeros of any requested shape and records the request.

    It holds no tensors (``contains`` is always False), so a model that inspects its checkpoint
    while loading sees a fresh source and builds exactly what its arguments describe.
    """

    def __init__(self) -> None:
        self.requested: dict[str, Shape] = {}
        self.metadata = {}

    def fetch(self, path, shape, init, dtype):
        if shape is None:
            raise self.missing(path)
        self.requested[path] = tuple(int(s) for s in shape)
        return mx.broadcast_to(mx.zeros((), dtype=dtype), shape)

    def describe(self) -> str:
        return "the recording VarBuilder"


@dataclass(frozen=True)
class Count:
    """A size argument of a model's ``load`` (class or keypoint count) and where a file shows it:
    ``shape(tensor)[0] // divisor``. A file without ``tensor`` implies ``default``, or ``None``
    (headless) when ``optional``."""

    arg: str
    tensor: str
    divisor: int
    default: int
    optional: bool = False


@dataclass(frozen=True)
class ModelSpec:
    """How to build one model family, and the size arguments its checkpoints imply."""

    model: str
    variants: tuple[str, ...]
    load: Callable[..., Module]
    counts: tuple[Count, ...] = ()

    def counts_from(self, shapes: Mapping[str, Shape]) -> dict[str, int | None]:
        """The size arguments a file implies (the defaults where it does not say)."""
        out = {}
        for c in self.counts:
            shape = shapes.get(c.tensor)
            out[c.arg] = shape[0] // c.divisor if shape else (None if c.optional else c.default)
        return out


def _load_resnet(vb: VarBuilder, variant: str, num_classes: int | None) -> Module:
    return ResNet.load(vb, variant, num_classes)


def _load_yolo(vb: VarBuilder, variant: str, num_classes: int) -> Module:
    return YoloV8.load(vb, variant, num_classes)


def _load_yolo_pose(vb: VarBuilder, variant: str, num_keypoints: int, num_classes: int) -> Module:
    return YoloV8Pose.load(vb, variant, num_keypoints, num_classes)


def _load_yolo_seg(vb: VarBuilder, variant: str, num_classes: int, num_masks: int) -> Module:
    return YoloV8Seg.load(vb, variant, num_classes, num_masks)


def _load_yolo_cls(vb: VarBuilder, variant: str, num_classes: int) -> Module:
    return YoloV8Cls.load(vb, variant, num_classes)


def _load_yolo11(vb: VarBuilder, variant: str, num_classes: int) -> Module:
    return Yolo11.load(vb, variant, num_classes)


def _load_yolo11_pose(vb: VarBuilder, variant: str, num_keypoints: int,
                      num_classes: int) -> Module:
    return Yolo11Pose.load(vb, variant, num_keypoints, num_classes)


def _load_yolo11_seg(vb: VarBuilder, variant: str, num_classes: int, num_masks: int) -> Module:
    return Yolo11Seg.load(vb, variant, num_classes, num_masks)


def _load_yolo11_cls(vb: VarBuilder, variant: str, num_classes: int) -> Module:
    return Yolo11Cls.load(vb, variant, num_classes)


def _load_sam(vb: VarBuilder, variant: str) -> Module:
    return Sam.load(vb, variant)


_YOLO_CLASSES = "head.cv3.0.2.weight"
# The variants are the models' own config tables: a variant added there is known here.
SPECS: dict[str, ModelSpec] = {s.model: s for s in (
    ModelSpec("resnet", tuple(RESNET_VARIANTS), _load_resnet,
              (Count("num_classes", "fc.weight", 1, 1000, optional=True),)),
    ModelSpec("yolo_v8", tuple(MULTIPLES), _load_yolo,
              (Count("num_classes", _YOLO_CLASSES, 1, 80),)),
    ModelSpec("yolo_v8_pose", tuple(MULTIPLES), _load_yolo_pose,
              (Count("num_keypoints", "head.cv4.0.2.weight", 3, 17),
               Count("num_classes", _YOLO_CLASSES, 1, 1))),
    ModelSpec("yolo_v8_seg", tuple(MULTIPLES), _load_yolo_seg,
              (Count("num_classes", _YOLO_CLASSES, 1, 80),
               Count("num_masks", "head.cv4.0.2.weight", 1, 32))),
    ModelSpec("yolo_v8_cls", tuple(MULTIPLES), _load_yolo_cls,
              (Count("num_classes", "head.linear.weight", 1, 1000),)),
    ModelSpec("yolo11", tuple(YOLO11_SCALES), _load_yolo11,
              (Count("num_classes", "model.23.cv3.0.2.weight", 1, 80),)),
    ModelSpec("yolo11_pose", tuple(YOLO11_SCALES), _load_yolo11_pose,
              (Count("num_keypoints", "model.23.cv4.0.2.weight", 3, 17),
               Count("num_classes", "model.23.cv3.0.2.weight", 1, 1))),
    ModelSpec("yolo11_seg", tuple(YOLO11_SCALES), _load_yolo11_seg,
              (Count("num_classes", "model.23.cv3.0.2.weight", 1, 80),
               Count("num_masks", "model.23.cv4.0.2.weight", 1, 32))),
    ModelSpec("yolo11_cls", tuple(YOLO11_SCALES), _load_yolo11_cls,
              (Count("num_classes", "model.10.linear.weight", 1, 1000),)),
    ModelSpec("mobile_sam", tuple(MOBILE_SAM_ENCODERS), _load_sam),
    ModelSpec("sam", tuple(VIT_CONFIGS), _load_sam),
)}


def spec(model: str, variant: str | None = None) -> ModelSpec:
    """The spec of ``model`` (checking ``variant`` too when given); CandleNNError when unknown."""
    found = SPECS.get(model)
    if found is None:
        raise CandleNNError(f"unknown model {model!r}; known: {', '.join(SPECS)}")
    if variant is not None and variant not in found.variants:
        raise CandleNNError(
            f"unknown variant {variant!r} for {model}; known: {', '.join(found.variants)}")
    return found


def build_model(model: str, variant: str, vb: VarBuilder, **counts: int | None) -> Module:
    """Build ``model``/``variant`` from ``vb``: the one way every tool builds a registered model.

    ``counts``: the size arguments (``num_classes=``, ``num_keypoints=``; ``None``: headless
    where the model allows it); the defaults of :data:`SPECS` otherwise.
    Raises CandleNNError for an unknown model/variant or a size argument it does not take.
    """
    found = spec(model, variant)
    unknown = set(counts) - {c.arg for c in found.counts}
    if unknown:
        raise CandleNNError(f"{model} takes no {', '.join(sorted(unknown))}")
    args = {c.arg: counts.get(c.arg, c.default) for c in found.counts}
    return found.load(vb, variant, **args)


class ModelUnavailableError(CandleNNError):
    """A model cannot be built to record its expected-tensor table."""


def expected_tensors(model: str, variant: str, **counts: int | None) -> dict[str, Shape]:
    """``name -> shape`` (PyTorch layout) of every tensor ``model``/``variant`` reads.

    ``counts``: as for :func:`build_model`. Raises CandleNNError for an unknown model/variant,
    ModelUnavailableError when the model cannot be built with these arguments.
    """
    return dict(_record(model, variant, _args(model, variant, counts))[0])


def knowingly_unread(model: str, variant: str, **counts: int | None) -> Callable[[str], bool]:
    """Whether a file of ``model``/``variant`` may hold a tensor (by name) beyond
    :func:`expected_tensors` (the classifier head a headless model leaves, BatchNorm counters):
    what the model's ``load`` declares to ``VarBuilder.check_all_read``. Any other extra tensor
    makes ``load`` refuse the file."""
    return _record(model, variant, _args(model, variant, counts))[1].declared_unused


def _args(model: str, variant: str,
          counts: Mapping[str, int | None]) -> tuple[tuple[str, int | None], ...]:
    found = spec(model, variant)
    return tuple(sorted((c.arg, counts.get(c.arg, c.default)) for c in found.counts))


@functools.lru_cache(maxsize=64)
def _record(model: str, variant: str, args: tuple[tuple[str, int | None], ...]
            ) -> tuple[tuple[tuple[str, Shape], ...], VarBuilder]:
    source = RecordingSource()
    vb = VarBuilder(source, dtype=mx.float32, device=Device.cpu())
    try:
        build_model(model, variant, vb, **dict(args))
    except CandleNNError as exc:
        raise ModelUnavailableError(f"cannot build {model} {variant}: {exc}") from exc
    return tuple(source.requested.items()), vb


@functools.lru_cache(maxsize=None)
def tensor_count(model: str, variant: str) -> int:
    """How many tensors ``model``/``variant`` (default size arguments) reads from its file."""
    return len(expected_tensors(model, variant))
