"""``SamPredictor``: embed an image once, then prompt it many times (MobileSAM's contract).

NumPy in, NumPy out; prompts in original-image pixels. The heavy image encoder runs only in
:meth:`SamPredictor.set_image` (or :meth:`SamPredictor.set_preprocessed_image`); every
:meth:`SamPredictor.predict` reuses the stored embedding.
"""

from __future__ import annotations

from candle_nn import ImageError
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
        image = np.asarray(image)
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ImageError(f"set_image expects an (H, W, 3) uint8 array, got {image.shape} "
                             f"{image.dtype}")
        if image_format not in ("RGB", "BGR"):
            raise ValueError(f"image_format must be 'RGB' or 'BGR', not {image_format!r}")
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
                raise ValueError("point_labels must be given with point_coords")
            coords = np.asarray(point_coords, dtype=np.float32).reshape(-1, 2)
            labels = np.asarray(point_labels).reshape(-1)
            if len(labels) != len(coords):
                raise ValueError(f"{len(coords)} points but {len(labels)} labels")
            coords = self.transform.apply_coords(coords, size)
            points = (mx.array(coords)[None], mx.array(labels.astype(np.float32))[None])
        if box is not None:
            boxes = mx.array(self.transform.apply_boxes(np.asarray(box).reshape(-1, 4), size))
        if mask_input is not None:
            masks = mx.array(np.asarray(mask_input, dtype=np.float32).reshape(1, 256, 256, 1))

        low_res, iou = self.model(self.features, points, boxes, masks, multimask_output)
        full = self.model.postprocess_masks(low_res, self.input_size, size)
        if not return_logits:
            full = full > self.model.mask_threshold
        full, iou, low_res = (np.array(a) for a in (full, iou, low_res))
        return (full[0].transpose(2, 0, 1), iou[0], low_res[0].transpose(2, 0, 1))

    def _require_image(self) -> None:
        if not self.is_image_set:
            raise RuntimeError("no image is set: call set_image(...) before predict(...)")
