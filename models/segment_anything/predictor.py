"""``SamPredictor``: embed an image once, then prompt it many times (MobileSAM's contract).

NumPy in, NumPy out; prompts in original-image pixels. The heavy image encoder runs only in
:meth:`SamPredictor.set_image` (or :meth:`SamPredictor.set_preprocessed_image`); every
:meth:`SamPredictor.predict` reuses the stored embedding.
"""

from __future__ import annotations

import math

from candle_nn import ImageError, ShapeMismatchError
from candle_nn.inputs import check_rgb_image
import mlx.core as mx
import numpy as np

from .sam import Sam
from .transforms import ResizeLongestSide


class SamPredictor:
    """Point / box / mask prompting of one image with a :class:`Sam` model."""

    def __init__(self, sam: Sam) -> None:
        self.model = sam
        self.transform = ResizeLongestSide(sam.image_size)
        self.reset_image()

    def reset_image(self) -> None:
        """Forget the current image and its embedding."""
        self.is_image_set = False
        self.features: mx.array | None = None
        self.original_size: tuple[int, int] | None = None
        self.input_size: tuple[int, int] | None = None

    def set_image(self, image: np.ndarray, image_format: str = "RGB") -> None:
        """Compute the embedding of ``image``: ``(H, W, 3)`` uint8, RGB (or ``"BGR"``).

        ResizeLongestSide to 1024, normalise, pad to 1024², run the encoder once.
        """
        image = check_rgb_image(image, where="SamPredictor.set_image", error=ImageError)
        if image_format not in ("RGB", "BGR"):
            raise ShapeMismatchError(
                f"image_format must be 'RGB' or 'BGR', not {image_format!r}")
        if image_format == "BGR":
            image = image[..., ::-1]
        resized = self.transform.apply_image(np.ascontiguousarray(image))
        pixels = mx.array(resized)[None]
        self.set_preprocessed_image(self.model.preprocess(pixels), image.shape[:2],
                                    resized.shape[:2])

    def set_preprocessed_image(self, input_image: mx.array, original_size: tuple[int, int],
                               input_size: tuple[int, int]) -> None:
        """Compute the embedding of an already normalised, padded ``(1, 1024, 1024, 3)`` image.

        ``original_size``: the ``(H, W)`` prompts and output masks refer to; ``input_size``:
        the ``(h, w)`` of the resized image inside the padding.
        """
        self.reset_image()
        self.features = self.model.embed(input_image)
        mx.eval(self.features)
        self.original_size = (int(original_size[0]), int(original_size[1]))
        self.input_size = (int(input_size[0]), int(input_size[1]))
        self.is_image_set = True

    def set_image_embedding(self, features: mx.array, original_size: tuple[int, int],
                            input_size: tuple[int, int]) -> None:
        """Use a precomputed embedding ``(1, 64, 64, 256)`` (e.g. saved from
        :meth:`get_image_embedding`) of an image of ``original_size`` resized to ``input_size``;
        the encoder does not run."""
        self.reset_image()
        self.features = features
        self.original_size = (int(original_size[0]), int(original_size[1]))
        self.input_size = (int(input_size[0]), int(input_size[1]))
        self.is_image_set = True

    def get_image_embedding(self) -> mx.array:
        """The current image's embedding, NHWC ``(1, 64, 64, 256)``."""
        self._require_image()
        return self.features

    def predict(self, point_coords: np.ndarray | None = None,
                point_labels: np.ndarray | None = None, box: np.ndarray | None = None,
                mask_input: np.ndarray | None = None, multimask_output: bool = True,
                return_logits: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Masks for the prompts, as MobileSAM's ``SamPredictor.predict``.

        Args:
            point_coords: ``(N, 2)`` ``(x, y)`` in original-image pixels.
            point_labels: ``(N,)``: 1 foreground, 0 background.
            box: ``(4,)`` ``x1, y1, x2, y2`` in original-image pixels.
            mask_input: ``(1, 256, 256)`` low-res logits from an earlier call.
            multimask_output: three candidate masks (``C = 3``) or one (``C = 1``).
            return_logits: return mask logits instead of booleans (threshold 0.0).

        Returns:
            ``masks`` ``(C, H, W)`` bool (or float32 logits) at the original image size,
            ``iou_predictions`` ``(C,)`` float32, ``low_res_logits`` ``(C, 256, 256)`` float32.
        """
        self._require_image()
        size = self.original_size
        points = boxes = masks = None
        if point_coords is not None:
            if point_labels is None:
                raise ShapeMismatchError(
                    "point_labels must be given with point_coords: one label per point, 1 "
                    "(foreground) or 0 (background)")
            coords = _prompt(point_coords, "point_coords", (-1, 2), "(N, 2) (x, y) pixels")
            labels = _prompt(point_labels, "point_labels", (-1,), "(N,) 1 or 0 per point")
            if len(labels) != len(coords) or len(coords) == 0:
                raise ShapeMismatchError(
                    f"{len(coords)} points but {len(labels)} labels: give one label per point "
                    "(and at least one point)")
            coords = self.transform.apply_coords(coords, size)
            points = (mx.array(coords)[None], mx.array(labels)[None])
        if box is not None:
            b = _prompt(box, "box", (4,), "(4,) x1, y1, x2, y2 pixels (one box per call)")
            boxes = mx.array(self.transform.apply_boxes(b.reshape(1, 4), size))
        if mask_input is not None:
            m = _prompt(mask_input, "mask_input", (1, 256, 256),
                        "(1, 256, 256) low-res logits, as the low_res_logits of an earlier "
                        "predict (one of its masks: low_res_logits[i:i + 1])")
            masks = mx.array(m.reshape(1, 256, 256, 1))

        low_res, iou = self.model(self.features, points, boxes, masks, multimask_output)
        full = self.model.postprocess_masks(low_res, self.input_size, size)
        if not return_logits:
            full = full > self.model.mask_threshold
        full, iou, low_res = (np.array(a) for a in (full, iou, low_res))
        return (full[0].transpose(2, 0, 1), iou[0], low_res[0].transpose(2, 0, 1))

    def _require_image(self) -> None:
        if not self.is_image_set:
            raise RuntimeError("no image is set: call set_image(...) before predict(...)")


def _prompt(value, name: str, shape: tuple[int, ...], want: str) -> np.ndarray:
    """``value`` as float32 of ``shape`` (``-1``: any length); ShapeMismatchError naming ``want``
    for anything else (a 3-number box, a mask of another size, text)."""
    try:
        a = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError):
        raise ShapeMismatchError(f"{name} must be numbers, {want}; got {value!r:.80}") from None
    rest = math.prod(n for n in shape if n != -1)
    if a.size % rest or (a.size != rest if -1 not in shape else a.size == 0):
        raise ShapeMismatchError(f"{name} must be {want}; got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ShapeMismatchError(f"{name} must be finite numbers; got {a.ravel()[:8]}")
    return a.reshape(shape)
