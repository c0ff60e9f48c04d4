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
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from candle_nn import CandleNNError, Device, VarBuilder
from candle_nn_models.segment_anything import Sam, SamPredictor, infer_encoder
from candle_nn_models.segment_anything.embedding_file import (read_image_embedding,
                                                              save_image_embedding)
from candle_nn_models.segment_anything.transforms import preprocess_shape
from candle_nn_models.scripts.image_loop import Batch
from candle_nn.cli import ArgumentParser
from candle_nn_models.scripts.common import (ImageInputError, add_device_argument,
                                             add_input_arguments, add_output_arguments,
                                             check_finite, compile_choice, load_rgb, number_arg,
                                             parse_device, run_main, shown)
from candle_nn_models.scripts.outputs import OutputFolder
from candle_nn_models.scripts.sam_everything import (add_everything_arguments, make_generator,
                                                     segment_everything)
from candle_nn_models.scripts.sam_outputs import mask_json, overlay_masks
from candle_nn_models.weights.registry import resolve_weights
from candle_nn_models.weights.spec import SPECS, build_model

POSITIVE, NEGATIVE, BOX = (0, 220, 0), (230, 0, 0), (255, 200, 0)
# --model: MobileSAM's encoders, then SAM's (the registry's variants: tiny, vit_b, vit_l, vit_h)
FAMILIES = ("mobile_sam", "sam")
MODELS = tuple(variant for family in FAMILIES for variant in SPECS[family].variants)
DEFAULT_OUT = "runs/segment/predict"


def load_sam(variant: "str | None", weights: "str | None",
             device: Device) -> tuple[Sam, Path, str]:
    """SAM with the ``variant`` encoder (one of :data:`MODELS`; ``None``: what ``weights`` holds,
    else MobileSAM's) from ``weights`` (default: the published file), built through the
    registry; the weights file and the encoder."""
    if variant is None and weights is not None:
        path = resolve_weights(FAMILIES[0], MODELS[0], weights)
        vb = VarBuilder.from_safetensors(path, device=device)
        variant = infer_encoder(vb, name=str(path))
    else:
        variant = variant or MODELS[0]
        path = resolve_weights(_family(variant), variant, weights)
        vb = VarBuilder.from_safetensors(path, device=device)
    return build_model(_family(variant), variant, vb), path, variant


def _family(variant: str) -> str:
    return next(f for f in FAMILIES if variant in SPECS[f].variants)


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
            sam, weights, args.model = load_sam(args.model, args.weights, device)
            sam.image_encoder.set_compiled(compile_choice(args.compile))
            sam.mask_threshold = args.threshold
            batch.doc["model"] = args.model
            batch.output = OutputFolder(args.out or DEFAULT_OUT, args.exist_ok)
            predictor = SamPredictor(sam)
            generator = make_generator(sam, args) if args.everything else None
            for path in batch.progress(paths):
                with batch.image(path, errors=(PromptError,)):
                    if generator is not None:
                        _everything(path, args, generator, batch)
                    else:
                        _segment(path, args, predictor, batch, weights)
    return batch.exit_code


def _load(path: Path, args: argparse.Namespace, side: int) -> np.ndarray:
    rgb = load_rgb(path, args.max_pixels)
    check_sam_shape(path, rgb, side)
    return rgb


def check_sam_shape(path: "str | os.PathLike", rgb: np.ndarray, side: int) -> None:
    """ImageInputError when SAM, scaling the longer side of ``rgb`` to ``side``, would leave the
    shorter one under 1 pixel."""
    height, width = rgb.shape[:2]
    if min(preprocess_shape(height, width, side)) < 1:
        raise ImageInputError(path, f"{width}x{height} is too elongated: SAM scales the longer "
                                    f"side to {side} px, which leaves the shorter one under 1 px "
                                    f"(the aspect ratio can be at most {2 * side}:1)")


def _everything(path: Path, args: argparse.Namespace, generator, batch: Batch) -> None:
    rgb = _load(path, args, generator.predictor.model.image_size)
    doc, lines = segment_everything(path, batch.output.claim_stem(path), rgb, generator,
                                    batch.output, progress=not args.json)
    batch.done(doc, lines)


def _segment(path: Path, args: argparse.Namespace, predictor: SamPredictor, batch: Batch,
             weights: Path) -> None:
    rgb = _load(path, args, predictor.model.image_size)
    height, width = rgb.shape[:2]
    prompts = parse_prompts(args.point, args.neg_point, args.box, height, width)
    if args.embedding:
        read_image_embedding(args.embedding, args.model, rgb).apply(predictor)
    else:
        predictor.set_image(rgb)
        if args.save_embedding:
            _save_embedding(predictor, args, rgb)
    logits, scores, low_res = predictor.predict(
        point_coords=np.array(prompts.points, dtype=np.float32) if prompts.points else None,
        point_labels=np.array(prompts.labels, dtype=np.int32) if prompts.points else None,
        box=np.array(prompts.box, dtype=np.float32) if prompts.box is not None else None,
        multimask_output=args.multimask, return_logits=True)
    check_finite(np.asarray(scores), weights)
    check_finite(np.asarray(low_res), weights)
    masks = logits > args.threshold

    best = int(np.argmax(scores))
    output = batch.output
    stem = output.claim_stem(path)
    files = {"mask": output.save_image(_mask_png(masks[best]), f"{stem}_mask.png", path)}
    if len(masks) > 1:
        for i, mask in enumerate(masks):
            files[f"mask_{i}"] = output.save_image(_mask_png(mask), f"{stem}_mask_{i}.png", path)
    files["overlay"] = output.save_image(overlay_image(rgb, list(masks), prompts),
                                         f"{stem}_overlay.png", path)
    records = [{**mask_json(mask), "predicted_iou": float(score), "best": i == best}
               for i, (mask, score) in enumerate(zip(masks, scores))]
    doc = {"image": shown(path), "width": width, "height": height, "mode": "prompts",
           "prompts": {"points": [list(p) for p in prompts.points], "labels": prompts.labels,
                       "box": list(prompts.box) if prompts.box is not None else None},
           "threshold": args.threshold, "masks": records}
    files["json"] = output.save_text(json.dumps(doc), f"{stem}_masks.json", path)
    if args.save_embedding:
        files["embedding"] = Path(args.save_embedding)
    doc["files"] = {k: shown(v) for k, v in files.items()}

    lines = [f"{shown(path)}: {width}x{height}, {prompts.describe()}"
             + (f", embedding from {args.embedding}" if args.embedding else "")]
    for i, record in enumerate(records):
        area = record["area"]
        lines.append(f"mask {i}: iou {record['predicted_iou']:.4f}, {area} pixels "
                     f"({100.0 * area / masks[i].size:.1f}%)"
                     + ("  <- best" if i == best and len(scores) > 1 else ""))
    lines += [f"wrote {shown(v)}" for v in files.values()]
    batch.done(doc, lines)


def _save_embedding(predictor: SamPredictor, args: argparse.Namespace, rgb: np.ndarray) -> None:
    """``--save-embedding``: written whole or not at all; a write error (a full disk, no
    permission, a read-only file system) is one CandleNNError naming the file."""
    from safetensors import SafetensorError

    try:
        save_image_embedding(predictor, args.save_embedding, args.model, rgb)
    except (SafetensorError, OSError) as exc:  # safetensors reports I/O errors as its own type
        raise CandleNNError(f"--save-embedding: cannot write {shown(args.save_embedding)}: "
                            f"{_io_reason(exc)}") from None


def _io_reason(exc: BaseException) -> str:
    """The OS's words for an I/O error, also when safetensors wraps it (``Os { code: 28, … }``)."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    code = re.search(r"\bcode: (\d+)", str(exc))
    return os.strerror(int(code.group(1))) if code else str(exc)


def _mask_png(mask: np.ndarray) -> Image.Image:
    return Image.fromarray(mask.astype(np.uint8) * 255)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``candle-segment-anything``."""
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
