"""``candle-segment-anything``: segment an object in an image with MobileSAM from point/box prompts,
or everything in it.

    candle-segment-anything --image bike.jpg [DIR 'photos/*.jpg' - ...] --point 0.6,0.55
                            [--point X,Y ...] [--neg-point X,Y] [--box X1,Y1,X2,Y2] [--multimask]
                            [--threshold X] [--save-embedding FILE | --embedding FILE]
                            [--model tiny|vit_b|vit_l|vit_h] [--weights FILE] [--device cpu]
                            [--out DIR] [--exist-ok] [--recursive] [--strict] [--max-pixels N]
                            [--json]
    candle-segment-anything --image bike.jpg --everything [--points-per-side 32 ...]

Coordinates: each value in ``[0, 1]`` is a fraction of the image width (x) or height (y), as in
candle's example; larger values are pixels. Writes ``<stem>_mask.png`` (the best mask, white on
black; with ``--multimask`` also ``<stem>_mask_<i>.png`` for each of the three candidates),
``<stem>_overlay.png`` (the image with each mask in its own colour and the prompts drawn) and
``<stem>_masks.json`` (prompts, scores, boxes, masks as COCO RLE) into the run folder (``--out``,
default ``runs/segment/predict``; a fresh ``predict2``, … when it is taken, unless ``--exist-ok``:
see ``scripts/outputs.py``) and prints the predicted IoU of each mask. ``<stem>`` is the image's
own, numbered (``x-2``) when another input of the run has it. ``--everything``: see
``scripts/sam_everything.py``.
``--save-embedding`` / ``--embedding`` (one image) keep the image encoder's output in a
safetensors file, so prompting the same image again skips the encoder. Every image gets the same
prompts (fractions suit images of different sizes). A malformed prompt is refused before the
model is loaded; a prompt outside one image skips that image before its encoder run. Each image's
files are written together or not at all.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from candle_nn import CandleNNError
from candle_nn_models.sam import (MODELS, PromptError, Prompts, SamModel, check_sam_shape, load,
                                  load_sam)
from candle_nn_models.scripts.image_loop import Batch
from candle_nn.cli import ArgumentParser
from candle_nn_models.scripts.common import (add_device_argument, add_input_arguments,
                                             add_output_arguments, compile_choice, number_arg,
                                             parse_device, run_main, shown)
from candle_nn_models.scripts.outputs import OutputFolder
from candle_nn_models.scripts.sam_everything import add_everything_arguments, save_everything
from candle_nn_models.scripts.sam_outputs import overlay_masks
from candle_nn_models.weights.spec import SPECS

__all__ = ["MODELS", "PromptError", "Prompts", "check_sam_shape", "load_sam", "main",
           "parse_prompts"]

POSITIVE, NEGATIVE, BOX = (0, 220, 0), (230, 0, 0), (255, 200, 0)
DEFAULT_OUT = "runs/segment/predict"


def parse_values(text: str, count: int, option: str) -> list[float]:
    """``"a,b"`` → ``[a, b]`` (exactly ``count`` finite numbers), PromptError otherwise."""
    parts = [p.strip() for p in text.split(",")]
    shape = "x,y" if count == 2 else "x1,y1,x2,y2"
    if len(parts) != count:
        raise PromptError(f"{option} {text!r}: expected {count} comma-separated numbers ({shape})")
    values = []
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            raise PromptError(
                f"{option} {text!r}: {part!r} is not a number (expected {shape})") from None
        if not math.isfinite(value):
            raise PromptError(f"{option} {text!r}: {part!r} is not a finite number")
        values.append(value)
    return values


def to_pixels(value: float, extent: int, axis: str, option: str, text: str) -> float:
    """A value in ``[0, 1]`` is a fraction of ``extent``; a larger one is pixels. Must lie in
    ``[0, extent]``."""
    pixels = value * extent if 0.0 <= value <= 1.0 else value
    if not 0.0 <= pixels <= extent:
        raise PromptError(f"{option} {text!r}: {axis}={value:g} is outside the image "
                          f"(0..{extent} pixels, or 0..1 as a fraction of the "
                          f"{'width' if axis == 'x' else 'height'})")
    return pixels


def parse_prompts(points: Sequence[str], neg_points: Sequence[str], box: str | None,
                  height: int, width: int) -> Prompts:
    """Command-line prompts → :class:`Prompts` in pixels of an ``height x width`` image."""
    prompts = Prompts()
    for option, texts, label in (("--point", points, 1), ("--neg-point", neg_points, 0)):
        for text in texts:
            x, y = parse_values(text, 2, option)
            prompts.points.append((to_pixels(x, width, "x", option, text),
                                   to_pixels(y, height, "y", option, text)))
            prompts.labels.append(label)
    if box is not None:
        x1, y1, x2, y2 = parse_values(box, 4, "--box")
        x1, x2 = (to_pixels(v, width, "x", "--box", box) for v in (x1, x2))
        y1, y2 = (to_pixels(v, height, "y", "--box", box) for v in (y1, y2))
        if x2 <= x1 or y2 <= y1:
            raise PromptError(f"--box {box!r}: need x1 < x2 and y1 < y2 (top-left corner first), "
                              f"got x {x1:g}..{x2:g}, y {y1:g}..{y2:g} pixels")
        prompts.box = (x1, y1, x2, y2)
    if not prompts.points and prompts.box is None:
        raise PromptError("no prompt given: pass --point X,Y (repeatable), --neg-point X,Y "
                          "and/or --box X1,Y1,X2,Y2")
    return prompts


def check_prompt_syntax(points: Sequence[str], neg_points: Sequence[str], box: str | None) -> None:
    """PromptError for a malformed or missing prompt (ranges are checked per image)."""
    for option, texts in (("--point", points), ("--neg-point", neg_points)):
        for text in texts:
            parse_values(text, 2, option)
    if box is not None:
        parse_values(box, 4, "--box")
    if not points and not neg_points and box is None:
        raise PromptError("no prompt given: pass --point X,Y (repeatable), --neg-point X,Y "
                          "and/or --box X1,Y1,X2,Y2, or --everything")


def overlay_image(rgb: np.ndarray, masks: Sequence[np.ndarray], prompts: Prompts):
    """The image with each mask in its own colour and the prompts drawn (positive green,
    negative red, the box yellow)."""
    from PIL import ImageDraw

    image = overlay_masks(rgb, masks)
    draw = ImageDraw.Draw(image)
    h, w = rgb.shape[:2]
    r = max(3, round(min(h, w) / 120))
    if prompts.box is not None:
        draw.rectangle(prompts.box, outline=BOX, width=max(2, r // 2))
    for (x, y), label in zip(prompts.points, prompts.labels):
        draw.ellipse((x - r, y - r, x + r, y + r), fill=POSITIVE if label == 1 else NEGATIVE,
                     outline=(255, 255, 255), width=max(1, r // 3))
    return image


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="candle-segment-anything",
        description="Segment the object at the given points / box with MobileSAM (TinyViT) "
                    "or SAM.",
        epilog="Coordinates in [0, 1] are fractions of the width/height; larger values are pixels.")
    add_input_arguments(parser, what="masks' scores and files")
    parser.add_argument("--point", action="append", default=[], metavar="X,Y",
                        help="a foreground point (repeatable)")
    parser.add_argument("--neg-point", action="append", default=[], metavar="X,Y",
                        help="a background point the mask must exclude (repeatable)")
    parser.add_argument("--box", default=None, metavar="X1,Y1,X2,Y2",
                        help="a box around the object (top-left, bottom-right)")
    parser.add_argument("--multimask", action="store_true",
                        help="predict SAM's three candidate masks and save each "
                             "(<stem>_mask_<i>.png); <stem>_mask.png is the best-scored one")
    parser.add_argument("--threshold", type=number_arg, default=0.0, metavar="X",
                        help="mask logit threshold: a pixel is in the mask when its logit is "
                             "above X (default 0.0, SAM's; higher gives tighter masks)")
    cache = parser.add_mutually_exclusive_group()
    cache.add_argument("--save-embedding", default=None, metavar="FILE",
                       help="also save the image encoder's output to FILE (safetensors; one "
                            "image)")
    cache.add_argument("--embedding", default=None, metavar="FILE",
                       help="use the encoder output saved with --save-embedding for this image "
                            "(no encoder run; one image)")
    parser.add_argument("--model", default=None, choices=MODELS,
                        help=f"{'/'.join(SPECS['mobile_sam'].variants)}: MobileSAM's TinyViT-5M; "
                             f"{'/'.join(SPECS['sam'].variants)}: the original SAM's ViT encoder "
                             "(default: what --weights holds, else MobileSAM)")
    parser.add_argument("--weights", default=None,
                        help="safetensors file with candle's tensor names (default: candle's "
                             "published file for --model from the Hugging Face hub: "
                             "mobile_sam-tiny-vitt.safetensors, sam_vit_b_01ec64.safetensors)")
    add_device_argument(parser)
    add_output_arguments(parser, DEFAULT_OUT)
    add_everything_arguments(parser)
    return parser


def check_writable_file(path: str, option: str) -> None:
    """CandleNNError unless ``path`` can be created in an existing, writable folder."""
    file = Path(path)
    folder = file.parent
    if file.is_dir():
        raise CandleNNError(f"{option} {path}: is a folder; name a file, e.g. image.safetensors")
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise CandleNNError(f"{option} {path}: folder {folder} does not exist or is not writable")


def check_mode(args: argparse.Namespace) -> None:
    """PromptError for options that do not go together; the prompts' syntax otherwise."""
    if args.everything:
        given = [o for o, v in (("--point", args.point), ("--neg-point", args.neg_point),
                                ("--box", args.box), ("--multimask", args.multimask),
                                ("--embedding", args.embedding),
                                ("--save-embedding", args.save_embedding)) if v]
        if given:
            raise PromptError(f"--everything makes its own prompts: drop {', '.join(given)}")
        return
    check_prompt_syntax(args.point, args.neg_point, args.box)
    if args.save_embedding:
        check_writable_file(args.save_embedding, "--save-embedding")


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    check_mode(args)  # before any image or model
    with Batch(args) as batch:
        paths = batch.start()
        if len(paths) > 1 and (args.embedding or args.save_embedding):
            raise CandleNNError(f"--embedding / --save-embedding hold one image's embedding, "
                                f"but {len(paths)} images were given")
        if paths:
            device = parse_device(args.device, args.verbose)
            model = load(args.weights, device, variant=args.model)
            model.sam.image_encoder.set_compiled(compile_choice(args.compile))
            args.model = batch.doc["model"] = model.variant
            batch.output = OutputFolder(args.out or DEFAULT_OUT, args.exist_ok)
            for path in batch.progress(paths):
                with batch.image(path, errors=(PromptError,)):
                    if args.everything:
                        _everything(path, args, model, batch)
                    else:
                        _segment(path, args, model, batch)
    return batch.exit_code


def _everything(path: Path, args: argparse.Namespace, model: SamModel, batch: Batch) -> None:
    image = model.image(path, args.max_pixels)
    doc, lines = save_everything(args, model, image, batch.output.claim_stem(path), batch.output)
    batch.done(doc, lines)


def _segment(path: Path, args: argparse.Namespace, model: SamModel, batch: Batch) -> None:
    image = model.image(path, args.max_pixels)
    height, width = image.rgb.shape[:2]
    prompts = parse_prompts(args.point, args.neg_point, args.box, height, width)
    if args.save_embedding:
        model.save_embedding(image, args.save_embedding)
    result = model.predict(image, points=prompts.points or None,
                           labels=prompts.labels or None, box=prompts.box,
                           multimask=args.multimask, threshold=args.threshold,
                           embedding=args.embedding)
    masks, best = result.masks, result.best
    output = batch.output
    stem = output.claim_stem(path)
    files = {"mask": output.save_image(_mask_png(masks[best]), f"{stem}_mask.png", path)}
    if len(masks) > 1:
        for i, mask in enumerate(masks):
            files[f"mask_{i}"] = output.save_image(_mask_png(mask), f"{stem}_mask_{i}.png", path)
    files["overlay"] = output.save_image(overlay_image(image.rgb, list(masks), result.prompts),
                                         f"{stem}_overlay.png", path)
    doc = result.to_json()
    files["json"] = output.save_text(json.dumps(doc), f"{stem}_masks.json", path)
    if args.save_embedding:
        files["embedding"] = Path(args.save_embedding)

    lines = [f"{shown(path)}: {width}x{height}, {result.prompts.describe()}"
             + (f", embedding from {args.embedding}" if args.embedding else "")]
    for i, record in enumerate(doc["masks"]):
        area = record["area"]
        lines.append(f"mask {i}: iou {record['predicted_iou']:.4f}, {area} pixels "
                     f"({100.0 * area / masks[i].size:.1f}%)"
                     + ("  <- best" if i == best and len(masks) > 1 else ""))
    lines += [f"wrote {shown(v)}" for v in files.values()]
    batch.done(result.to_json(files=files), lines)


def _mask_png(mask: np.ndarray) -> Image.Image:
    return Image.fromarray(mask.astype(np.uint8) * 255)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``candle-segment-anything``."""
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
