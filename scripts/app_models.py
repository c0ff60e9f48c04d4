"""``candle-nn-app``'s models and what each view asks of them. Every method runs on the model
worker's thread (:mod:`candle_nn_models.scripts.app_worker`); the models are loaded as the CLIs
load them (the same weights resolution, checks and errors), requests are validated here, and the
answers are JSON-ready dicts with images as base64 PNG/JPEG.
"""

from __future__ import annotations

import argparse
import base64
import io
import math
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from PIL import Image

from candle_nn import CandleNNError
from candle_nn_models.imagenet import preprocess
from candle_nn_models.segment_anything import SamAutomaticMaskGenerator, SamPredictor
from candle_nn_models.scripts.app_sessions import Embedding, Sessions
from candle_nn_models.scripts.app_worker import Abandoned
from candle_nn_models.scripts.common import check_finite, compile_choice, parse_device
from candle_nn_models.scripts.resnet import image_size, load_classifier, top_k_probabilities
from candle_nn_models.scripts.sam_everything import KNOBS, knob_type
from candle_nn_models.scripts.sam_outputs import mask_json, palette
from candle_nn_models.scripts.segment_anything import PromptError, check_sam_shape, load_sam
from candle_nn_models.scripts.yolo_v8_weights import load_yolo
from candle_nn_models.yolo import YOLO

MAX_POINTS = 64  # prompts per request: SAM was trained with a handful; more is a mistake or abuse
# "segment everything" knobs the page may set, and the largest values the server accepts (the
# work grows with points_per_side² and 4**crop_n_layers)
EVERYTHING_LIMITS = {"points_per_side": 64, "points_per_batch": 256, "crop_n_layers": 2}


class AppModels:
    """SAM (predictor and automatic masks), YOLOv8 detect and pose, and a ResNet classifier."""

    def __init__(self, args: argparse.Namespace, sessions: Sessions,
                 stop_requested: Callable[[], bool] = lambda: False) -> None:
        device = parse_device(args.device, args.verbose)
        compiled = compile_choice(args.compile)
        self.sessions, self.stop_requested = sessions, stop_requested
        with _option("--sam-weights"):
            self.sam, self.sam_weights, self.sam_variant = load_sam(args.sam_model,
                                                                    args.sam_weights, device)
        self.sam.image_encoder.set_compiled(compiled)
        self.predictor = SamPredictor(self.sam)
        self.detectors: dict[str, YOLO] = {}  # the YOLO task API, as candle-yolo-v8 uses it
        for task, weights in (("detect", args.detect_weights), ("pose", args.pose_weights)):
            with _option(f"--{task}-weights"):
                self.detectors[task] = load_yolo(weights, task, None, device)
            self.detectors[task].model.set_compiled(compiled)
        with _option("--classify-weights"):
            self.classifier, self.labels, self.classify_weights = load_classifier(
                args.classify_weights, None, device)
        self.classifier.set_compiled(compiled)
        self.classify_size = image_size(self.classify_weights)

    def info(self) -> dict[str, Any]:
        """What the page shows: the models and the detectors' class names."""
        return {"sam": self.sam_variant,
                "detect": {task: {"model": str(d.spec), "names": d.names}
                           for task, d in self.detectors.items()},
                "classify": {"model": self.classifier.variant, "classes": len(self.labels)},
                "everything": {name: {"default": _knob_default(name),
                                      "max": EVERYTHING_LIMITS.get(name)}
                               for name, *_ in KNOBS.values()}}

    # -- Segment ------------------------------------------------------------------------------
    def embed(self, session: str, image: str) -> dict[str, Any]:
        """Compute (or find) the image's embedding, so that the first prompt is fast."""
        start = time.perf_counter()
        cached = self._set_image(session, image)
        return {"cached": cached, "ms": _ms(start)}

    def segment(self, session: str, image: str, request: dict[str, Any]) -> dict[str, Any]:
        """Masks for ``request``'s ``points`` (``[[x, y], ...]`` pixels), ``labels`` (1 / 0) and
        ``box`` (``[x1, y1, x2, y2]`` or null); ``multimask``: SAM's three candidates."""
        start = time.perf_counter()
        rgb = self.sessions.image(session, image)
        points, labels, box = _prompts(request, rgb.shape[0], rgb.shape[1])
        cached = self._set_image(session, image)
        logits, scores, low_res = self.predictor.predict(
            point_coords=points, point_labels=labels, box=box,
            multimask_output=bool(request.get("multimask", True)), return_logits=True)
        check_finite(np.asarray(scores), self.sam_weights)
        check_finite(np.asarray(low_res), self.sam_weights)
        masks = logits > self.sam.mask_threshold
        records = [{**mask_json(mask), "predicted_iou": round(float(score), 4),
                    "png": _png(Image.fromarray(mask).convert("1"))}  # 1-bit: 2.5x faster
                   for mask, score in zip(masks, scores)]
        return {"masks": records, "best": int(np.argmax(scores)), "embedding_cached": cached,
                "ms": _ms(start)}

    def everything(self, session: str, image: str, request: dict[str, Any]) -> dict[str, Any]:
        """Automatic masks with ``request``'s knobs (the CLI's ``--everything`` options by their
        generator names); every mask in its own colour on a transparent PNG, and the records."""
        start = time.perf_counter()
        rgb = self.sessions.image(session, image)
        check_sam_shape("image", rgb, self.sam.image_size)
        knobs = _knobs(request)
        try:
            generator = SamAutomaticMaskGenerator(self.sam, output_mode="binary_mask", **knobs)
        except ValueError as exc:
            raise PromptError(f"segment everything: {exc}") from None
        records = generator.generate(rgb, progress=self._stop_if_abandoned)
        masks = [r.pop("segmentation") for r in records]
        for record, mask in zip(records, masks):
            record.update(mask_json(mask))
        return {"masks": records, "overlay": _png(_colour_masks(masks, rgb.shape[:2])),
                "points": len(generator.point_grids[0]), "ms": _ms(start)}

    def _stop_if_abandoned(self, done: int, total: int) -> None:
        """The generator's progress callback: its page has gone, so stop (a full run is about a
        minute of the one model worker that every visitor waits on)."""
        if self.stop_requested():
            raise Abandoned(f"segment everything stopped after {done} of {total} points: the "
                            "page went away")

    def _set_image(self, session: str, image: str) -> bool:
        """Point the predictor at the image's embedding, computing it when not cached; whether it
        was cached."""
        embedding = self.sessions.embedding(session, image)
        if embedding is not None:
            self.predictor.set_image_embedding(embedding.features, embedding.original_size,
                                               embedding.input_size)
            return True
        rgb = self.sessions.image(session, image)
        check_sam_shape("image", rgb, self.sam.image_size)
        self.predictor.set_image(rgb)
        self.sessions.put_embedding(session, image, Embedding(
            self.predictor.features, self.predictor.original_size, self.predictor.input_size))
        return False

    # -- Detect / Classify ----------------------------------------------------------------------
    def detect(self, session: str, image: str, request: dict[str, Any]) -> dict[str, Any]:
        """YOLOv8 ``task`` (detect / pose) with ``conf``, ``iou`` and ``classes`` (ids or null):
        the drawing (JPEG) and the detections."""
        start = time.perf_counter()
        rgb = self.sessions.image(session, image)
        task = request.get("task", "detect")
        if not isinstance(task, str) or task not in self.detectors:
            raise PromptError(f"task {str(task)[:40]!r}: expected one of "
                              f"{', '.join(self.detectors)}")
        d = self.detectors[task]
        conf = _fraction(request.get("conf", 0.25), "confidence")
        iou = _fraction(request.get("iou", 0.7), "IoU")
        classes = _classes(request.get("classes"), d.spec.num_classes)
        (result,) = d.predict(rgb, conf=conf, iou=iou, classes=classes)
        drawing = Image.fromarray(result.plot())
        return {"task": task, "model": str(d.spec), "conf": conf, "iou": iou, "classes": classes,
                "width": rgb.shape[1], "height": rgb.shape[0],
                "detections": result.to_json()["detections"],
                "image": _jpeg(drawing), "ms": _ms(start)}

    def classify(self, session: str, image: str, request: dict[str, Any]) -> dict[str, Any]:
        """The ``top_k`` (default 5) labels with their probabilities."""
        start = time.perf_counter()
        rgb = self.sessions.image(session, image)
        top_k = request.get("top_k", 5)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= 100:
            raise PromptError(f"top-k {top_k!r}: expected a whole number from 1 to 100")
        top = top_k_probabilities(self.classifier, preprocess(rgb, *self.classify_size)[None],
                                  min(top_k, len(self.labels)))[0]
        check_finite(np.array([p for _, p in top]), self.classify_weights)
        return {"model": self.classifier.variant,
                "top_k": [{"index": i, "label": self.labels[i], "probability": round(p, 6)}
                          for i, p in top], "ms": _ms(start)}


@contextmanager
def _option(flag: str) -> Iterator[None]:
    """Name the option whose weights failed to load (the loaders speak of the CLIs' --weights)."""
    try:
        yield
    except CandleNNError as exc:
        text = str(exc).replace("--weights", flag)
        raise CandleNNError(text if flag in text else f"{flag}: {text}") from None


def _prompts(request: dict[str, Any], height: int, width: int,
             ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """``(points (N, 2), labels (N,), box (4,))`` from the page's JSON, each checked: finite
    numbers inside the image, labels 0 or 1, a box with x1 < x2 and y1 < y2, at least one."""
    points, labels = request.get("points") or [], request.get("labels") or []
    box = request.get("box")
    if not isinstance(points, list) or not isinstance(labels, list) or len(points) != len(labels):
        raise PromptError("points and labels must be lists of the same length")
    if len(points) > MAX_POINTS:
        raise PromptError(f"{len(points)} points: at most {MAX_POINTS} per request")
    coords = [_xy(p, height, width) for p in points]
    if any(label not in (0, 1) or isinstance(label, bool) for label in labels):
        raise PromptError("each point's label must be 1 (foreground) or 0 (background)")
    box_array = None
    if box is not None:
        if not isinstance(box, list) or len(box) != 4:
            raise PromptError("box must be [x1, y1, x2, y2]")
        x1, y1 = _xy(box[:2], height, width)
        x2, y2 = _xy(box[2:], height, width)
        if x2 <= x1 or y2 <= y1:
            raise PromptError("box: need x1 < x2 and y1 < y2 (a box with an area)")
        box_array = np.array([x1, y1, x2, y2], dtype=np.float32)
    if not coords and box_array is None:
        raise PromptError("no prompt: click a point or drag a box")
    if not coords:
        return None, None, box_array
    return (np.array(coords, dtype=np.float32), np.array(labels, dtype=np.int32), box_array)


def _xy(value: Any, height: int, width: int) -> tuple[float, float]:
    if (not isinstance(value, list) or len(value) != 2
            or not all(_is_number(v) for v in value)):
        raise PromptError(f"a point must be [x, y] in pixels, not {str(value)[:40]}")
    x, y = float(value[0]), float(value[1])
    if not (0 <= x <= width and 0 <= y <= height):
        raise PromptError(f"point ({x:g}, {y:g}) is outside the {width}x{height} image")
    return x, y


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _fraction(value: Any, what: str) -> float:
    if not _is_number(value) or not 0 <= value <= 1:
        raise PromptError(f"{what} {value!r}: expected a number from 0 to 1")
    return float(value)


def _classes(value: Any, num_classes: int) -> list[int] | None:
    if value is None or value == []:
        return None
    if (not isinstance(value, list)
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            or not all(0 <= v < num_classes for v in value)):
        raise PromptError(f"classes must be class ids 0..{num_classes - 1}")
    return value


def _knobs(request: dict[str, Any]) -> dict[str, Any]:
    """The generator's arguments: the CLI's knobs (their checks and defaults), capped by
    :data:`EVERYTHING_LIMITS`."""
    knobs = {}
    for flag, (name, kind, low, _) in KNOBS.items():
        value = request.get(name, _knob_default(name))
        if value is None:  # the generator's choice (points_per_batch: by device)
            continue
        try:
            value = knob_type(kind, low)(str(value))
        except argparse.ArgumentTypeError as exc:
            raise PromptError(f"{flag.lstrip('-').replace('-', ' ')}: {exc}") from None
        if name in EVERYTHING_LIMITS and value > EVERYTHING_LIMITS[name]:
            raise PromptError(f"{flag.lstrip('-').replace('-', ' ')} {value}: at most "
                              f"{EVERYTHING_LIMITS[name]} here")
        knobs[name] = value
    return knobs


def _knob_default(name: str) -> Any:
    import inspect

    return inspect.signature(SamAutomaticMaskGenerator.__init__).parameters[name].default


def _colour_masks(masks: Sequence[np.ndarray], hw: tuple[int, int]) -> Image.Image:
    """Every mask in its own colour (largest first, smaller ones on top) on transparency."""
    out = np.zeros((*hw, 4), dtype=np.uint8)
    colours = palette(len(masks))
    for i in sorted(range(len(masks)), key=lambda j: -int(masks[j].sum())):
        out[masks[i]] = (*colours[i], 150)
    return Image.fromarray(out, "RGBA")


def _png(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _jpeg(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="JPEG", quality=90)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _ms(start: float) -> float:
    return round(1000 * (time.perf_counter() - start), 1)


def image_jpeg(rgb: np.ndarray) -> str:
    """The image the page shows and prompts on, as base64 JPEG (the server's decoding, EXIF
    orientation applied: the page's pixels are the model's)."""
    return _jpeg(Image.fromarray(rgb))
