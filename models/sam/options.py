"""``SamModel.everything``'s options: the automatic mask generator's main knobs, each with its
one help text and lowest value; their defaults are the generator's (MobileSAM's).
``candle-segment-anything --everything`` generates its flags from :data:`KNOBS`."""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any

from candle_nn import CandleNNError

from candle_nn_models.segment_anything import SamAutomaticMaskGenerator

__all__ = ["KNOBS", "everything_defaults", "check_everything_options"]

# flag -> (generator argument, type, lowest allowed value, help)
KNOBS = {
    "--points-per-side": ("points_per_side", int, 1, "points along each side of the prompt grid"),
    "--points-per-batch": ("points_per_batch", int, 1, "points decoded together"),
    "--pred-iou-thresh": ("pred_iou_thresh", float, 0, "keep masks whose predicted IoU is above"),
    "--stability-score-thresh": ("stability_score_thresh", float, 0,
                                 "keep masks whose stability score is at least"),
    "--box-nms-thresh": ("box_nms_thresh", float, 0,
                         "box IoU above which a lower-scored duplicate is dropped"),
    "--crop-n-layers": ("crop_n_layers", int, 0, "extra layers of image crops (0: the image only)"),
    "--min-mask-region-area": ("min_mask_region_area", int, 0,
                               "fill holes / drop islands smaller than this many pixels"),
}


def everything_defaults() -> dict[str, Any]:
    """Each knob's default: the generator's (``points_per_batch`` ``None``: by device)."""
    params = inspect.signature(SamAutomaticMaskGenerator.__init__).parameters
    return {name: params[name].default for name, *_ in KNOBS.values()}


def check_everything_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` (knob name -> value) checked: an unknown name, a value of the wrong kind or
    below its knob's lowest is one CandleNNError naming it. ``None`` keeps the default."""
    knobs = {name: (kind, low) for name, kind, low, _ in KNOBS.values()}
    unknown = sorted(set(options) - set(knobs))
    if unknown:
        raise CandleNNError(f"unknown everything option {unknown[0]!r}: the options are "
                            f"{', '.join(knobs)}")
    for name, value in options.items():
        kind, low = knobs[name]
        if value is None:
            continue
        number = isinstance(value, numbers.Integral if kind is int else numbers.Real)
        if not number or isinstance(value, bool) or not math.isfinite(value) or value < low:
            what = "a whole number" if kind is int else "a finite number"
            raise CandleNNError(f"{name}={value!r}: pass {what} >= {low}")
    return options
