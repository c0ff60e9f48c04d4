"""``candle-segment-anything --everything``: automatic masks for the whole image (no prompts),
with the generator's main knobs as flags. Writes ``<stem>_everything.png`` (every mask in its
own colour), ``<stem>_masks/<i>.png`` (one white-on-black PNG per mask, as segment-anything's
``amg.py`` does; no folder when there is no mask) and ``<stem>_masks.json`` (the generator's
records, masks as COCO RLE)."""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from PIL import Image

from candle_nn import CandleNNError
from candle_nn_models.segment_anything import Sam, SamAutomaticMaskGenerator
from candle_nn_models.segment_anything.automatic_mask_generator import POINTS_PER_BATCH
from candle_nn_models.scripts.common import number_arg, shown
from candle_nn_models.scripts.outputs import OutputFolder
from candle_nn_models.scripts.sam_outputs import overlay_masks

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


def add_everything_arguments(parser: argparse.ArgumentParser) -> None:
    """``--everything`` and the generator's knobs (defaults: MobileSAM's)."""
    group = parser.add_argument_group("automatic masks")
    group.add_argument("--everything", action="store_true",
                       help="segment everything: masks from a grid of point prompts (no --point/"
                            "--box); writes <stem>_everything.png, <stem>_masks/<i>.png and "
                            "<stem>_masks.json (a progress bar on a terminal, none with --json)")
    params = inspect.signature(SamAutomaticMaskGenerator.__init__).parameters
    for flag, (name, kind, low, text) in KNOBS.items():
        default = params[name].default
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


def make_generator(sam: Sam, args: argparse.Namespace) -> SamAutomaticMaskGenerator:
    """The generator for the command line's knobs (CandleNNError for a combination it refuses)."""
    knobs = {name: getattr(args, name) for name, *_ in KNOBS.values()}
    try:
        return SamAutomaticMaskGenerator(sam, output_mode="coco_rle", **knobs)
    except ValueError as exc:
        raise CandleNNError(f"--everything: {exc}") from exc


def segment_everything(path: Path, stem: str, rgb: np.ndarray,
                       generator: SamAutomaticMaskGenerator, output: OutputFolder,
                       progress: bool = True) -> tuple[dict[str, Any], list[str]]:
    """Run the generator on one image and stage its outputs in ``output``, named from ``stem``
    (claimed for ``path`` in the run folder); returns the JSON document and the lines to print.
    ``progress``: the points decoded so far as a bar on stderr, when stderr is a terminal (a
    run takes about a minute on a CPU).
    """
    with points_bar(path, progress) as report:
        records = generator.generate(rgb, progress=report)
    masks = [_decode(r["segmentation"]) for r in records]
    overlay = output.save_image(overlay_masks(rgb, masks), f"{stem}_everything.png", path)
    for i, mask in enumerate(masks):
        output.save_image(Image.fromarray(mask.astype(np.uint8) * 255), f"{stem}_masks/{i}.png",
                          path)
    mask_dir = output.path / f"{stem}_masks"
    h, w = rgb.shape[:2]
    doc = {"image": shown(path), "width": w, "height": h, "mode": "everything", "masks": records}
    json_path = output.save_text(json.dumps(doc), f"{stem}_masks.json", path)
    lines = [f"{shown(path)}: {w}x{h}, everything: {len(records)} mask(s) from "
             f"{len(generator.point_grids[0])} points"]
    for i, r in enumerate(records):
        x, y, bw, bh = r["bbox"]
        lines.append(f"mask {i}: iou {r['predicted_iou']:.4f}, stability "
                     f"{r['stability_score']:.4f}, {r['area']} pixels "
                     f"({100.0 * r['area'] / (h * w):.1f}%), box {x},{y},{bw}x{bh}")
    lines += [f"wrote {shown(overlay)}"]
    lines += [f"wrote {shown(mask_dir)}/ ({len(masks)} PNGs)"] if masks else []
    lines += [f"wrote {shown(json_path)}"]
    doc["files"] = {"overlay": shown(overlay), "masks": shown(mask_dir) if masks else None,
                    "json": shown(json_path)}
    return doc, lines


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


def _decode(rle: dict[str, Any]) -> np.ndarray:
    from pycocotools import mask as mask_utils

    return mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()}).astype(bool)
