"""The YOLO pipeline, once: images from any source → letterbox (classify: its crop) → forward →
non-finite check → NMS, masks and keypoints (classify: probabilities). ``YOLO.predict`` runs it
per image (``candle-yolo-v8``, the app), ``YOLO.predict_batch`` per batch of frames (``--video``),
``YOLO.predict_letterboxed`` on inputs :func:`model_input` made elsewhere (``candle-nn-batch``'s
Ray tasks); validation (``val.py``) shares :func:`forward`."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

from candle_nn import CandleNNError, model_dtype
import mlx.core as mx
import numpy as np

from candle_nn.inputs import check_rgb_image
from candle_nn_models.finite import check_finite
from candle_nn_models.image_file import IMAGE_SUFFIXES, ImageInputError, load_rgb
from candle_nn_models.letterbox import Letterbox, letterbox
from candle_nn_models.yolo_v8 import YoloV8Spec
from candle_nn_models.yolo_v8_classify import preprocess
from candle_nn_models.yolo_v8_masks import InstanceMasks, segment_postprocess
from candle_nn_models.yolo_v8_post import Detection, postprocess

from .options import PredictOptions

__all__ = ["classify_probs", "detect_batch", "forward", "images_of", "model_input"]

Source = Any  # a path, folder or glob (str | Path), a PIL image, an (H, W, 3) uint8 array, ...


def model_input(rgb: np.ndarray, size: int, square: bool = False) -> Letterbox:
    """One ``(H, W, 3)`` uint8 RGB image as predict feeds it to a detector: letterboxed to
    ``size`` on its long side, padded to ``size x size`` (``square``) or only up to a multiple of
    32. Images letterboxed elsewhere (candle-nn-batch's Ray tasks) come from here too."""
    return letterbox(rgb, size, auto=not square)


def forward(model, task: str, boxes: Sequence[Letterbox],
            weights: "str | os.PathLike | None" = None) -> tuple[np.ndarray, np.ndarray | None]:
    """One forward pass over letterboxed images of one shape: the prediction ``(N, C, A)`` as
    float32 NumPy, checked finite (else an error naming ``weights``, when given), and for a
    segment model its ``(N, h, w, num_masks)`` prototypes (else ``None``)."""
    x = mx.array(np.concatenate([lb.as_input() for lb in boxes])).astype(model_dtype(model))
    out = model(x)
    pred = out[0] if task == "segment" else out
    pred = np.array(pred.astype(mx.float32))
    if weights is not None:
        check_finite(pred, weights)
    protos = np.array(out[1].astype(mx.float32)) if task == "segment" else None
    return pred, protos


def detect_batch(model, spec: YoloV8Spec, boxes: Sequence[Letterbox], options: PredictOptions,
                 weights: "str | os.PathLike | None" = None,
                 ) -> list[tuple[list[Detection], InstanceMasks | None]]:
    """Per letterboxed image (one shape for all), its detections (``conf``, ``iou``,
    ``max_det``, ``agnostic_nms``, ``classes``) and, for segmentation, their masks at
    ultralytics' resolution (``retina_masks``; each detection also holds its mask on the
    original image). A non-finite prediction is an error naming ``weights`` (when given)."""
    pred, protos = forward(model, spec.task, boxes, weights)
    nms = dict(conf=options.conf, iou=options.iou, max_det=options.max_det,
               agnostic=options.agnostic_nms, classes=options.classes)
    if spec.task == "segment":
        return segment_postprocess(pred, protos, list(boxes), num_classes=spec.num_classes,
                                   num_masks=spec.num_masks, retina=options.retina_masks, **nms)
    return [(dets, None) for dets in postprocess(pred, list(boxes), num_classes=spec.num_classes,
                                                 num_keypoints=spec.num_keypoints, **nms)]


def classify_probs(model, rgb: np.ndarray, size: int,
                   weights: "str | os.PathLike") -> np.ndarray:
    """A classifier's ``(num_classes,)`` float32 probabilities for one ``(H, W, 3)`` uint8 RGB
    image: ``preprocess`` at ``size`` (the file's transform when it crops to that size), the
    output checked finite (else an error naming ``weights``)."""
    x = preprocess(rgb, size, model.preprocessing)[None]
    probs = np.array(model(mx.array(x).astype(model_dtype(model))).astype(mx.float32))[0]
    check_finite(probs, weights)
    return probs


def images_of(source: Source, max_pixels: int) -> Iterator[tuple[Path | None, np.ndarray]]:
    """``(path or None, (H, W, 3) uint8 RGB)`` per image of ``source``, read one at a time:
    a file, a folder (its files with an image suffix, sorted), a glob (``'photos/*.jpg'``,
    ``**`` spans folders), a PIL image, an ``(H, W, 3)`` uint8 RGB array, an ``mx.array`` of one
    such image or an ``(N, H, W, 3)`` batch, or a list or tuple mixing them. An image that cannot
    be read is an :class:`~candle_nn_models.image_file.ImageInputError` naming it; any other
    source is a CandleNNError."""
    if isinstance(source, (list, tuple)):
        if not source:
            raise CandleNNError("predict got an empty list of sources: pass at least one image")
        for item in source:
            if isinstance(item, (list, tuple)):
                raise CandleNNError("predict takes a list of sources, not a list of lists")
            yield from images_of(item, max_pixels)
    elif isinstance(source, (str, os.PathLike)):
        for path in _paths(Path(source)):
            yield path, load_rgb(path, max_pixels)
    elif isinstance(source, mx.array):
        batch = np.array(source)
        for image in (batch if batch.ndim == 4 else [batch]):
            yield None, check_rgb_image(image, where="predict")
    elif _is_pil(source):
        yield None, np.asarray(source.convert("RGB"), dtype=np.uint8)
    elif isinstance(source, np.ndarray):
        yield None, check_rgb_image(source, where="predict")
    else:
        raise CandleNNError(f"predict cannot read a {type(source).__name__}: pass a path, folder "
                            "or glob, a PIL image, an (H, W, 3) uint8 RGB NumPy array, an "
                            "mx.array of such images, or a list of them")


def _paths(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.iterdir()
                       if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not found:
            raise ImageInputError(path, f"no image files ({', '.join(IMAGE_SUFFIXES)}) in this "
                                        "folder")
        return found
    if not path.exists() and glob.has_magic(str(path)):
        found = sorted(Path(p) for p in glob.glob(str(path), recursive=True)
                       if Path(p).suffix.lower() in IMAGE_SUFFIXES and Path(p).is_file())
        if not found:
            raise ImageInputError(path, "no image file matches this pattern")
        return found
    return [path]  # a file (load_rgb says what is wrong with anything else)


def _is_pil(source: Any) -> bool:
    from PIL import Image

    return isinstance(source, Image.Image)
