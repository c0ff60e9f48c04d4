"""What each model/variant reads from a weights file: the expected ``name -> shape`` table.

The table is not written down anywhere: it is recorded by loading our own model classes through a
:class:`RecordingSource`, a VarBuilder source that hands out free, lazy zero tensors of the
requested shape and writes down every name and shape asked for. So the table always agrees with
the models' ``load`` code (candle's names), and nothing is computed (MLX is lazy and the zeros are
never evaluated).

Model classes are imported lazily: ``weights`` works (list, download, convert) without them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Mapping

from candle_nn import CandleNNError, Device, VarBuilder  # before mlx: candle_nn picks the BLAS
from candle_nn.var_builder import TensorSource
import mlx.core as mx  # noqa: I001

Shape = tuple[int, ...]


class RecordingSource(TensorSource):
    """A VarBuilder source that returns zeros of any requested shape and records the request.

    It holds no tensors (``contains`` is always False), so a model that inspects its checkpoint
    while loading sees a fresh source and builds exactly what its arguments describe.
    """

    def __init__(self) -> None:
        self.requested: dict[str, Shape] = {}
        self.metadata = {}

    def names(self) -> list[str]:
        return []

    def contains(self, path: str) -> bool:
        return False

    def shape(self, path: str) -> Shape:
        raise self.missing(path)

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
    load: Callable[..., object]
    counts: tuple[Count, ...] = ()

    def counts_from(self, shapes: Mapping[str, Shape]) -> dict[str, int | None]:
        """The size arguments a file implies (the defaults where it does not say)."""
        out = {}
        for c in self.counts:
            shape = shapes.get(c.tensor)
            out[c.arg] = shape[0] // c.divisor if shape else (None if c.optional else c.default)
        return out


def _load_resnet(vb: VarBuilder, variant: str, num_classes: int | None) -> object:
    from models.resnet import ResNet

    return ResNet.load(vb, variant, num_classes)


def _load_yolo(vb: VarBuilder, variant: str, num_classes: int) -> object:
    from models.yolo_v8 import YoloV8

    return YoloV8.load(vb, variant, num_classes)


def _load_yolo_pose(vb: VarBuilder, variant: str, num_keypoints: int, num_classes: int) -> object:
    from models.yolo_v8 import YoloV8Pose

    return YoloV8Pose.load(vb, variant, num_keypoints, num_classes)


def _load_mobile_sam(vb: VarBuilder, variant: str) -> object:
    from models.segment_anything import Sam

    return Sam.load_tiny(vb)


def _load_sam(vb: VarBuilder, variant: str) -> object:
    from models.segment_anything import Sam

    return Sam.load_vit(vb, variant)


_YOLO_CLASSES = "head.cv3.0.2.weight"
SPECS: dict[str, ModelSpec] = {s.model: s for s in (
    ModelSpec("resnet", tuple(f"resnet{d}" for d in (18, 34, 50, 101, 152)), _load_resnet,
              (Count("num_classes", "fc.weight", 1, 1000, optional=True),)),
    ModelSpec("yolo_v8", tuple("nsmlx"), _load_yolo,
              (Count("num_classes", _YOLO_CLASSES, 1, 80),)),
    ModelSpec("yolo_v8_pose", tuple("nsmlx"), _load_yolo_pose,
              (Count("num_keypoints", "head.cv4.0.2.weight", 3, 17),
               Count("num_classes", _YOLO_CLASSES, 1, 1))),
    ModelSpec("mobile_sam", ("tiny",), _load_mobile_sam),
    ModelSpec("sam", ("vit_b",), _load_sam),
)}


class ModelUnavailableError(CandleNNError):
    """The model class needed to build an expected-tensor table cannot be imported or built."""


def expected_tensors(model: str, variant: str, **counts: int | None) -> dict[str, Shape]:
    """``name -> shape`` (PyTorch layout) of every tensor ``model``/``variant`` reads.

    ``counts``: the size arguments (``num_classes=``, ``num_keypoints=``; ``None``: headless
    where the model allows it); defaults otherwise.
    Raises CandleNNError for an unknown model/variant, ModelUnavailableError when the model
    class cannot be imported or built.
    """
    spec = SPECS.get(model)
    if spec is None:
        raise CandleNNError(f"unknown model {model!r}; known: {', '.join(SPECS)}")
    if variant not in spec.variants:
        raise CandleNNError(
            f"unknown {model} variant {variant!r}; known: {', '.join(spec.variants)}")
    args = {c.arg: counts.get(c.arg, c.default) for c in spec.counts}
    return dict(_record(model, variant, tuple(sorted(args.items()))))


@functools.lru_cache(maxsize=64)
def _record(model: str, variant: str,
            args: tuple[tuple[str, int | None], ...]) -> tuple[tuple[str, Shape], ...]:
    source = RecordingSource()
    vb = VarBuilder(source, dtype=mx.float32, device=Device.cpu())
    try:
        SPECS[model].load(vb, variant, **dict(args))
    except ImportError as exc:
        raise ModelUnavailableError(f"the {model} model code is not available ({exc})") from exc
    except CandleNNError as exc:
        raise ModelUnavailableError(f"cannot build {model} {variant}: {exc}") from exc
    return tuple(source.requested.items())
