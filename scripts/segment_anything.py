"""``candle-segment-anything``: segment an object in an image with MobileSAM from point/box prompts.

    candle-segment-anything --image bike.jpg [DIR 'photos/*.jpg' - ...] --point 0.6,0.55
                            [--point X,Y ...] [--neg-point X,Y] [--box X1,Y1,X2,Y2] [--multimask]
                            [--model tiny|vit_b|vit_l|vit_h] [--weights FILE] [--device cpu]
                            [--out DIR] [--recursive] [--strict] [--max-pixels N] [--json]

Coordinates: each value in ``[0, 1]`` is a fraction of the image width (x) or height (y), as in
candle's example; larger values are pixels. Writes ``<stem>_mask.png`` (the best mask, white on
black) and ``<stem>_overlay.png`` (the image with the mask tinted and the prompts drawn) into
``--out`` and prints the predicted IoU of each mask. Every image gets the same prompts (fractions
suit images of different sizes). A malformed prompt is refused before the model is loaded; a
prompt outside one image skips that image before its encoder run. Each image's two files are
written together or not at all.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from candle_nn import CandleNNError, VarBuilder
from models.segment_anything import Sam, SamPredictor
from models.segment_anything.transforms import preprocess_shape
from scripts.image_batch import Batch
from scripts.common import (ImageInputError, add_device_argument, add_input_arguments,
                            check_finite, load_rgb, parse_device, run_main, shown)
from scripts.outputs import OutputFolder
from scripts.common import compile_choice
from weights.registry import resolve_weights

TINT = np.array([30, 144, 255], dtype=np.float32)  # mask colour in the overlay
POSITIVE, NEGATIVE, BOX = (0, 220, 0), (230, 0, 0), (255, 200, 0)
MODELS = ("tiny", "vit_b", "vit_l", "vit_h")


class PromptError(CandleNNError):
    """A point or box given on the command line is malformed or outside the image."""


@dataclass
class Prompts:
    """Prompts in original-image pixels."""

    points: list[tuple[float, float]] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    box: tuple[float, float, float, float] | None = None

    def describe(self) -> str:
        pos = sum(1 for label in self.labels if label == 1)
        neg = len(self.labels) - pos
        box = "no box" if self.box is None else "box " + ",".join(f"{v:g}" for v in self.box)
        return f"{pos} point(s), {neg} negative point(s), {box}"


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
                          "and/or --box X1,Y1,X2,Y2")


def overlay_image(rgb: np.ndarray, mask: np.ndarray, prompts: Prompts):
    """The image with ``mask`` tinted and the prompts drawn (positive green, negative red)."""
    from PIL import ImageDraw

    out = rgb.astype(np.float32)
    out[mask] = 0.45 * out[mask] + 0.55 * TINT
    image = Image.fromarray(out.round().astype(np.uint8))
    draw = ImageDraw.Draw(image)
    h, w = mask.shape
    r = max(3, round(min(h, w) / 120))
    if prompts.box is not None:
        draw.rectangle(prompts.box, outline=BOX, width=max(2, r // 2))
    for (x, y), label in zip(prompts.points, prompts.labels):
        draw.ellipse((x - r, y - r, x + r, y + r), fill=POSITIVE if label == 1 else NEGATIVE,
                     outline=(255, 255, 255), width=max(1, r // 3))
    return image


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
                        help="predict SAM's three candidate masks and keep the best-scored one")
    parser.add_argument("--model", default="tiny", choices=MODELS,
                        help="tiny: MobileSAM's TinyViT-5M (default); vit_b/vit_l/vit_h: the "
                             "original SAM's ViT encoder")
    parser.add_argument("--weights", default=None,
                        help="safetensors file with candle's tensor names (default: candle's "
                             "published file for --model from the Hugging Face hub: "
                             "mobile_sam-tiny-vitt.safetensors, sam_vit_b_01ec64.safetensors)")
    add_device_argument(parser)
    parser.add_argument("--out", default=".", help="output folder (default: the current folder)")
    return parser


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    check_prompt_syntax(args.point, args.neg_point, args.box)  # before any image or model
    with Batch(args) as batch:
        paths = batch.start()
        if paths:
            device = parse_device(args.device, args.verbose)
            registry_model = "mobile_sam" if args.model == "tiny" else "sam"
            weights = resolve_weights(registry_model, args.model, args.weights)
            vb = VarBuilder.from_safetensors(weights, device=device)
            sam = Sam.load_tiny(vb) if args.model == "tiny" else Sam.load_vit(vb, args.model)
            sam.image_encoder.set_compiled(compile_choice(args.compile))
            batch.doc["model"] = args.model
            batch.output = OutputFolder(args.out)
            predictor = SamPredictor(sam)
            for path in batch.progress(paths):
                with batch.image(path, errors=(PromptError,)):
                    _segment(path, args, predictor, batch, weights)
    return batch.exit_code


def _segment(path: Path, args: argparse.Namespace, predictor: SamPredictor, batch: Batch,
             weights: Path) -> None:
    rgb = load_rgb(path, args.max_pixels)
    height, width = rgb.shape[:2]
    prompts = parse_prompts(args.point, args.neg_point, args.box, height, width)
    side = predictor.model.image_size
    if min(preprocess_shape(height, width, side)) < 1:
        raise ImageInputError(path, f"{width}x{height} is too elongated: SAM scales the longer "
                                    f"side to {side} px, which leaves the shorter one under 1 px "
                                    f"(the aspect ratio can be at most {2 * side}:1)")
    predictor.set_image(rgb)
    masks, scores, low_res = predictor.predict(
        point_coords=np.array(prompts.points, dtype=np.float32) if prompts.points else None,
        point_labels=np.array(prompts.labels, dtype=np.int32) if prompts.points else None,
        box=np.array(prompts.box, dtype=np.float32) if prompts.box is not None else None,
        multimask_output=args.multimask)
    check_finite(np.asarray(scores), weights)
    check_finite(np.asarray(low_res), weights)

    best = int(np.argmax(scores))
    stem = path.stem
    mask_path = batch.output.save_image(Image.fromarray(masks[best].astype(np.uint8) * 255),
                                        f"{stem}_mask.png")
    overlay_path = batch.output.save_image(overlay_image(rgb, masks[best], prompts),
                                           f"{stem}_overlay.png")
    lines = [f"{shown(path)}: {width}x{height}, {prompts.describe()}"]
    entries = []
    for i, score in enumerate(scores):
        area = int(masks[i].sum())
        entries.append({"iou": float(score), "area": area, "best": i == best})
        lines.append(f"mask {i}: iou {score:.4f}, {area} pixels "
                     f"({100.0 * area / masks[i].size:.1f}%)"
                     + ("  <- best" if i == best and len(scores) > 1 else ""))
    lines += [f"wrote {shown(mask_path)}", f"wrote {shown(overlay_path)}"]
    batch.done({"image": shown(path), "width": width, "height": height, "masks": entries,
                "mask": shown(mask_path), "overlay": shown(overlay_path)}, lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``candle-segment-anything``."""
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
