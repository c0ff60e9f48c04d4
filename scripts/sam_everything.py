"""``candle-segment-anything --everything``: automatic masks for the whole image (no prompts),
with the generator's main knobs as flags. Writes ``<stem>_everything.png`` (every mask in its
own colour), ``<stem>_masks/<i>.png`` (one white-on-black PNG per mask, as segment-anything's
``amg.py`` does; no folder when there is no mask) and ``<stem>_masks.json`` (the generator's
records, masks as COCO RLE)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from PIL import Image

from candle_nn_models.sam import KNOBS, SamImage, SamModel
from candle_nn_models.sam.options import everything_defaults
from candle_nn_models.segment_anything.automatic_mask_generator import POINTS_PER_BATCH
from candle_nn_models.scripts.common import number_arg, shown
from candle_nn_models.scripts.outputs import OutputFolder
from candle_nn_models.scripts.sam_outputs import overlay_masks

__all__ = ["KNOBS", "add_everything_arguments", "knob_type", "points_bar", "save_everything"]


def add_everything_arguments(parser: argparse.ArgumentParser) -> None:
    """``--everything`` and the generator's knobs (defaults: MobileSAM's)."""
    group = parser.add_argument_group("automatic masks")
    group.add_argument("--everything", action="store_true",
                       help="segment everything: masks from a grid of point prompts (no --point/"
                            "--box); writes <stem>_everything.png, <stem>_masks/<i>.png and "
                            "<stem>_masks.json (a progress bar on a terminal, none with --json)")
    defaults = everything_defaults()
    for flag, (name, kind, low, text) in KNOBS.items():
        default = defaults[name]
        by_device = f"{POINTS_PER_BATCH['cpu']} on the CPU, {POINTS_PER_BATCH['gpu']} on a GPU"
        shown_default = by_device if default is None else f"{default:g}"
        group.add_argument(flag, dest=name, type=knob_type(kind, low), default=default,
                           metavar="N" if kind is int else "X",
                           help=f"{text} (default {shown_default})")


def knob_type(kind: type, low: float):
    """An argparse ``type=`` for a knob: a finite ``kind`` of at least ``low``."""
    def parse(text: str):
        value = number_arg(text, kind)
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= {low}")
        return value
    return parse


def save_everything(args: argparse.Namespace, model: SamModel, image: SamImage, stem: str,
                    output: OutputFolder) -> tuple[dict[str, Any], list[str]]:
    """``model.everything`` on one image with the command line's knobs and threshold, its
    outputs staged in ``output`` named from ``stem`` (claimed for the image in the run folder);
    returns the JSON record and the lines to print. A bar of the points decoded so far goes to
    stderr when it is a terminal and ``--json`` is off (a run takes about a minute on a CPU)."""
    knobs = {name: getattr(args, name) for name, *_ in KNOBS.values()}
    path = image.path
    with points_bar(path, not args.json) as report:
        result = model.everything(image, threshold=args.threshold, progress=report, **knobs)
    masks, records = result.masks, result.records
    overlay = output.save_image(overlay_masks(image.rgb, list(masks)), f"{stem}_everything.png",
                                path)
    for i, mask in enumerate(masks):
        output.save_image(Image.fromarray(mask.astype(np.uint8) * 255), f"{stem}_masks/{i}.png",
                          path)
    mask_dir = output.path / f"{stem}_masks"
    json_path = output.save_text(json.dumps(result.to_json()), f"{stem}_masks.json", path)
    h, w = result.orig_shape
    lines = [f"{shown(path)}: {w}x{h}, everything: {len(records)} mask(s) from "
             f"{result.points} points"]
    for i, r in enumerate(records):
        x, y, bw, bh = r["bbox"]
        lines.append(f"mask {i}: iou {r['predicted_iou']:.4f}, stability "
                     f"{r['stability_score']:.4f}, {r['area']} pixels "
                     f"({100.0 * r['area'] / (h * w):.1f}%), box {x},{y},{bw}x{bh}")
    lines += [f"wrote {shown(overlay)}"]
    lines += [f"wrote {shown(mask_dir)}/ ({len(masks)} PNGs)"] if len(masks) else []
    lines += [f"wrote {shown(json_path)}"]
    files = {"overlay": overlay, "masks": mask_dir if len(masks) else None, "json": json_path}
    return result.to_json(files=files), lines


@contextlib.contextmanager
def points_bar(path: Path, enabled: bool) -> Iterator[Callable[[int, int], None]]:
    """A ``progress(done, total)`` callback for :meth:`SamAutomaticMaskGenerator.generate`
    drawing a tqdm bar of prompt points on stderr (only when ``enabled`` and stderr is a
    terminal); the bar is removed when the block ends."""
    from tqdm import tqdm

    bar: list[tqdm] = []

    def report(done: int, total: int) -> None:
        if not bar:
            # mininterval 0: a redraw per batch of points (tens of ms of work each), so every
            # step shows, the last one included
            bar.append(tqdm(total=total, unit="point", desc=shown(path.name), leave=False,
                            file=sys.stderr, dynamic_ncols=True, mininterval=0, miniters=1,
                            disable=None if enabled else True))
        bar[0].update(done - bar[0].n)

    try:
        yield report
    finally:
        if bar:
            bar[0].close()
