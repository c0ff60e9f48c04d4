"""``SamModel``: MobileSAM or SAM as a task, as ``candle-segment-anything`` runs it:
``sam.load(weights).predict(image, points=..., box=...)`` → :class:`SamResult`, and
``.everything(image)`` → :class:`EverythingResult`. The encoder runs once per image: prompting
the same :class:`SamImage` (``model.image(source)``) or array again reuses its output."""

from __future__ import annotations

import math
import numbers
import os
import re
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from candle_nn import CandleNNError, Device, check_weights_path

from candle_nn_models.finite import check_finite
from candle_nn_models.image_decode import DEFAULT_MAX_PIXELS
from candle_nn_models.image_file import ImageInputError, shown
from candle_nn_models.segment_anything import Sam, SamAutomaticMaskGenerator, SamPredictor
from candle_nn_models.segment_anything.embedding_file import (EmbeddingFileError, image_digest,
                                                              read_image_embedding,
                                                              save_image_embedding)
from candle_nn_models.segment_anything.transforms import preprocess_shape
from candle_nn_models.yolo.predict import Source, images_of

from .build import load_sam
from .options import check_everything_options
from .prompts import Prompts
from .result import EverythingResult, SamResult

__all__ = ["SamImage", "SamModel", "check_sam_shape", "load"]


class SamImage(NamedTuple):
    """One image read for SAM: the file it came from (``None`` for an array or PIL image) and
    its ``(H, W, 3)`` uint8 RGB pixels."""

    path: Path | None
    rgb: np.ndarray


def check_sam_shape(path: "str | os.PathLike | None", rgb: np.ndarray, side: int) -> None:
    """ImageInputError when SAM, scaling the longer side of ``rgb`` to ``side``, would leave the
    shorter one under 1 pixel."""
    height, width = rgb.shape[:2]
    if min(preprocess_shape(height, width, side)) < 1:
        raise ImageInputError(path if path is not None else "image",
                              f"{width}x{height} is too elongated: SAM scales the longer side to "
                              f"{side} px, which leaves the shorter one under 1 px (the aspect "
                              f"ratio can be at most {2 * side}:1)")


class SamModel:
    """A SAM model and what it was loaded from.

    Attributes:
        sam: the network (:class:`~candle_nn_models.segment_anything.Sam`), ``variant`` its
            encoder (``tiny``: MobileSAM; ``vit_b``/``vit_l``/``vit_h``), ``path`` the weights
            file, ``predictor`` the :class:`SamPredictor` holding the current image's embedding.
    """

    def __init__(self, sam: Sam, path: Path, variant: str) -> None:
        self.sam, self.path, self.variant = sam, path, variant
        self.predictor = SamPredictor(sam)
        # the image the predictor holds: its array and the digest of its pixels then
        self._embedded: tuple[np.ndarray, str] | None = None

    def image(self, source: "Source | SamImage", max_pixels: int = DEFAULT_MAX_PIXELS) -> SamImage:
        """One image as SAM reads it: a path, a PIL image, an ``(H, W, 3)`` uint8 RGB array or
        an ``mx.array`` of one; an unreadable image, or one too elongated for SAM, is an
        ImageError naming it, anything else (several images) a CandleNNError."""
        if isinstance(source, SamImage):
            return source
        found = []
        for item in images_of(source, max_pixels):
            found.append(item)
            if len(found) > 1:
                raise CandleNNError("SAM segments one image a call: pass one path, PIL image or "
                                    "(H, W, 3) uint8 array, and call again for the next")
        (path, rgb), = found
        check_sam_shape(path, rgb, self.sam.image_size)
        return SamImage(path, rgb)

    def predict(self, image: "Source | SamImage", *, points: Any = None, labels: Any = None,
                box: Any = None, multimask: bool = False, threshold: float = 0.0,
                embedding: "str | os.PathLike | None" = None) -> SamResult:
        """The masks for the prompts on ``image`` (see :meth:`image`): ``points`` ``(N, 2)``
        ``(x, y)`` pixels with ``labels`` ``(N,)`` 1 (foreground, the default) or 0
        (background), and/or ``box`` ``(x1, y1, x2, y2)`` pixels. One mask, or SAM's three with
        ``multimask``; a pixel is in a mask when its logit is above ``threshold``.
        ``embedding``: a file :meth:`save_embedding` wrote for this image and model, used
        instead of running the encoder. A prompt outside the image is a PromptError, before the
        encoder runs."""
        image = self.image(image)
        height, width = image.rgb.shape[:2]
        prompts = Prompts.of(points, labels, box, height, width)
        _check_threshold(threshold)
        if embedding is not None:
            read_image_embedding(embedding, self.variant, image.rgb).apply(self.predictor)
            self._embedded = (image.rgb, image_digest(image.rgb))
        else:
            self._embed(image.rgb)
        logits, scores, low_res = self.predictor.predict(
            point_coords=np.array(prompts.points, dtype=np.float32) if prompts.points else None,
            point_labels=np.array(prompts.labels, dtype=np.int32) if prompts.points else None,
            box=np.array(prompts.box, dtype=np.float32) if prompts.box is not None else None,
            multimask_output=multimask, return_logits=True)
        check_finite(np.asarray(scores), self.path)
        check_finite(np.asarray(low_res), self.path)
        return SamResult(image.path, (height, width), np.asarray(logits) > threshold,
                         np.asarray(scores), np.asarray(logits), prompts, float(threshold))

    def save_embedding(self, image: "Source | SamImage", path: "str | os.PathLike") -> Path:
        """Write the encoder's output for ``image`` to ``path`` (safetensors, whole or not at
        all), for :meth:`predict`'s ``embedding``; a write error is one EmbeddingFileError."""
        from safetensors import SafetensorError

        image = self.image(image)
        self._embed(image.rgb)
        try:
            return save_image_embedding(self.predictor, path, self.variant, image.rgb)
        except (SafetensorError, OSError) as exc:  # safetensors reports I/O errors as its own
            raise EmbeddingFileError(f"--save-embedding: cannot write {shown(path)}: "
                                     f"{_io_reason(exc)}") from None

    def everything(self, image: "Source | SamImage", *, threshold: float = 0.0,
                   progress: Callable[[int, int], None] | None = None,
                   **options: Any) -> EverythingResult:
        """Every mask in ``image`` from a grid of point prompts (MobileSAM's automatic mask
        generator). ``options``: its knobs (``points_per_side=32``, ``points_per_batch``,
        ``pred_iou_thresh=0.88``, ``stability_score_thresh=0.95``, ``box_nms_thresh=0.7``,
        ``crop_n_layers=0``, ``min_mask_region_area=0``); ``threshold``: the mask logit
        threshold; ``progress(done, total)``: called with the points decoded so far."""
        image = self.image(image)
        knobs = {k: v for k, v in check_everything_options(options).items() if v is not None}
        _check_threshold(threshold)
        try:
            generator = SamAutomaticMaskGenerator(self.sam, output_mode="coco_rle", **knobs)
        except ValueError as exc:
            raise CandleNNError(f"--everything: {exc}") from exc
        saved, self.sam.mask_threshold = self.sam.mask_threshold, float(threshold)
        try:
            records = generator.generate(image.rgb, progress=progress)
        finally:
            self.sam.mask_threshold = saved
        return EverythingResult(image.path, image.rgb.shape[:2], records,
                                len(generator.point_grids[0]))

    def _embed(self, rgb: np.ndarray) -> None:
        """Run the encoder on ``rgb`` unless the predictor holds this very array, unchanged (the
        same :class:`SamImage` or NumPy array prompted again; another array is encoded anew)."""
        key = (rgb, image_digest(rgb))
        if self._embedded is None or self._embedded[0] is not rgb or self._embedded[1] != key[1]:
            self._embedded = None
            self.predictor.set_image(rgb)
            self._embedded = key

    def __repr__(self) -> str:
        return f"SamModel({self.variant}, {str(self.path)!r})"


def _check_threshold(threshold: Any) -> None:
    if not isinstance(threshold, numbers.Real) or isinstance(threshold, bool) \
            or not math.isfinite(threshold):
        raise CandleNNError(f"threshold={threshold!r}: pass a finite number (SAM's is 0.0)")


def _io_reason(exc: BaseException) -> str:
    """The OS's words for an I/O error, also when safetensors wraps it (``Os { code: 28, … }``)."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    code = re.search(r"\bcode: (\d+)", str(exc))
    return os.strerror(int(code.group(1))) if code else str(exc)


def load(weights: "str | os.PathLike | None" = None, device: "str | Device | None" = None, *,
         variant: str | None = None) -> SamModel:
    """The SAM model in ``weights`` (candle's tensor names; default: candle's published
    MobileSAM, or SAM's file for ``variant``, fetched once from the Hugging Face hub) on
    ``device`` (``"cpu"``, ``"gpu"``, ``"gpu:N"``, a :class:`~candle_nn.Device`; default
    ``Device.default()``). ``variant``: ``tiny`` (MobileSAM), ``vit_b``, ``vit_l``, ``vit_h``;
    default what the file holds."""
    device = Device.default() if device is None else Device.parse(device)
    if weights is not None:
        weights = check_weights_path(weights)
    sam, path, variant = load_sam(variant, weights, device)
    return SamModel(sam, path, variant)
