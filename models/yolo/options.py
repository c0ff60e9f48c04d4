"""The YOLO task API's predict options, each with its one default and help: ``YOLO.predict``
takes them as keyword arguments, and ``candle-yolo-v8`` generates its options from the same
fields (``metadata``: the command-line ``flag``, the argparse ``kind`` of its value, the help
text's ``group``), so a new option is added here only."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Sequence

from candle_nn import CandleNNError

from candle_nn_models.image_decode import DEFAULT_MAX_PIXELS
from candle_nn_models.task_options import options_from_keywords
from candle_nn_models.training_size import MAX_YOLO_INPUT_SIZE

__all__ = ["PredictOptions"]

MAIN, ULTRALYTICS = "main", "ultralytics"  # the CLI help groups


def _option(default: Any, flag: str, kind: str, group: str, help: str,
            cli: bool = True) -> Any:
    """A field whose ``help`` may name ``{default}``; ``cli=False``: the CLI defines the flag
    elsewhere (with this default)."""
    return field(default=default, metadata={"flag": flag, "kind": kind, "group": group,
                                            "help": help, "cli": cli})


@dataclass(frozen=True)
class PredictOptions:
    """What ``YOLO.predict`` does with each image (ultralytics' ``predict`` names and defaults;
    ``imgsz`` is ``--size`` on the command line). Built with checks: a bad value is one
    :class:`~candle_nn.CandleNNError` naming the option."""

    conf: float = _option(0.25, "--conf", "fraction", MAIN,
                          "minimum class score (default {default})")
    iou: float = _option(0.7, "--iou", "fraction", MAIN,
                         "NMS IoU threshold: a box overlapping a better one by more than this is "
                         "dropped (default {default}, as ultralytics' yolo predict)")
    imgsz: int | None = _option(None, "--size", "size", MAIN,
                                "longest side of the model input (classify: the centre crop), a "
                                f"multiple of 32 up to {MAX_YOLO_INPUT_SIZE}; default: the size "
                                "the weights were trained at (as ultralytics' predict), else 640 "
                                "(classify: 224)")
    square: bool = _option(False, "--square", "switch", MAIN,
                           "pad every input to size x size "
                           "(default: pad only up to a multiple of 32)")
    top_k: int = _option(5, "--top-k", "count", MAIN,
                         "--task classify: classes printed per image (default {default})")
    classes: Sequence[int] | None = _option(None, "--classes", "class_ids", ULTRALYTICS,
                                            "keep only these class ids, e.g. --classes 0 2 3")
    max_det: int = _option(300, "--max-det", "count", ULTRALYTICS,
                           "maximum detections per image (default {default})")
    agnostic_nms: bool = _option(False, "--agnostic-nms", "switch", ULTRALYTICS,
                                 "class-agnostic NMS: boxes of different classes suppress each "
                                 "other")
    half: bool = _option(False, "--half", "switch", ULTRALYTICS, "run the model in float16")
    retina_masks: bool = _option(False, "--retina-masks", "switch", ULTRALYTICS,
                                 "--task segment: masks at the original image's resolution")
    max_pixels: int = _option(DEFAULT_MAX_PIXELS, "--max-pixels", "pixels", MAIN,
                              "refuse images with more pixels than this", cli=False)

    def __post_init__(self) -> None:
        for name in ("conf", "iou"):
            value = getattr(self, name)
            if not _number(value) or not 0.0 <= value <= 1.0:
                raise CandleNNError(f"{name}={value!r}: pass a number in [0, 1]")
        if self.imgsz is not None and not (_whole(self.imgsz) and 0 < self.imgsz
                                           <= MAX_YOLO_INPUT_SIZE and self.imgsz % 32 == 0):
            raise CandleNNError(f"imgsz={self.imgsz!r}: pass a positive multiple of 32 up to "
                                f"{MAX_YOLO_INPUT_SIZE} (e.g. 640), or None for the size the "
                                "weights were trained at")
        for name in ("top_k", "max_det", "max_pixels"):
            value = getattr(self, name)
            if not _whole(value) or value < 1:
                raise CandleNNError(f"{name}={value!r}: pass a whole number >= 1")
        if self.classes is not None:
            classes = [self.classes] if _whole(self.classes) else self.classes
            if isinstance(classes, (str, bytes)) or not all(
                    _whole(c) and c >= 0 for c in classes):
                raise CandleNNError(f"classes={self.classes!r}: pass class ids (0, 1, 2, ...), "
                                    "e.g. classes=[0, 2]")
            object.__setattr__(self, "classes", [int(c) for c in classes])

    @classmethod
    def from_keywords(cls, options: dict[str, Any]) -> "PredictOptions":
        """The options from ``predict``'s keyword arguments; an unknown one is an error listing
        the known ones."""
        return options_from_keywords(cls, options)


def _number(value: Any) -> bool:
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
