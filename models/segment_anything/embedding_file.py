"""Image embeddings on disk: run SAM's encoder once, prompt the image again later.

A safetensors file with one tensor, ``image_embeddings`` ``(1, 64, 64, 256)`` float32 NHWC, and
metadata: the image's original and resized sizes, the model that made it (``tiny``, ``vit_b``,
...), and a SHA-256 of the image's RGB pixels so that the embedding is never applied to another
image by mistake.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from candle_nn import CandleNNError
from candle_nn.atomic_write import atomic_write
import mlx.core as mx
import numpy as np

from .predictor import SamPredictor
from .sam import IMAGE_EMBEDDING_SIZE, PROMPT_EMBED_DIM

FORMAT = "candle_nn.sam_image_embedding.v1"
EMBEDDING_SHAPE = (1, IMAGE_EMBEDDING_SIZE, IMAGE_EMBEDDING_SIZE, PROMPT_EMBED_DIM)


class EmbeddingFileError(CandleNNError):
    """An embedding file is missing, unreadable, or belongs to another image or model."""


def image_digest(rgb: np.ndarray) -> str:
    """SHA-256 of an ``(H, W, 3)`` uint8 image's shape and pixels."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    return hashlib.sha256(repr(rgb.shape).encode() + rgb.tobytes()).hexdigest()


def save_image_embedding(predictor: SamPredictor, path: "str | os.PathLike", model: str,
                         rgb: np.ndarray) -> Path:
    """Write the predictor's current embedding of ``rgb`` (atomically: complete or absent)."""
    from safetensors.numpy import save_file

    path = Path(path)
    embedding = np.array(predictor.get_image_embedding(), dtype=np.float32)
    metadata = {"format": FORMAT, "model": model, "image_sha256": image_digest(rgb),
                "original_size": "x".join(map(str, predictor.original_size)),
                "input_size": "x".join(map(str, predictor.input_size))}
    try:
        with atomic_write(path) as tmp:
            save_file({"image_embeddings": embedding}, str(tmp), metadata=metadata)
    except OSError as exc:
        raise EmbeddingFileError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


@dataclass(frozen=True)
class ImageEmbedding:
    """An image's encoder output and the sizes the predictor needs with it."""

    features: np.ndarray  # (1, 64, 64, 256) float32 NHWC
    original_size: tuple[int, int]
    input_size: tuple[int, int]

    def apply(self, predictor: SamPredictor) -> None:
        """Make this the predictor's current image (no encoder run)."""
        predictor.set_image_embedding(mx.array(self.features), self.original_size,
                                      self.input_size)


def read_image_embedding(path: "str | os.PathLike", model: str,
                         rgb: np.ndarray) -> ImageEmbedding:
    """The embedding in a file made by :func:`save_image_embedding` for this ``model`` and this
    very image; EmbeddingFileError otherwise (checked before any model is loaded)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.exists():
        raise EmbeddingFileError(f"embedding file not found: {path} (make one with "
                                 "--save-embedding FILE)")
    if not path.is_file():
        what = "a folder" if path.is_dir() else "not a regular file"
        raise EmbeddingFileError(f"embedding file {path} is {what}: pass the file "
                                 "--save-embedding wrote")
    try:
        with safe_open(str(path), framework="numpy") as fh:
            metadata = fh.metadata() or {}
            if metadata.get("format") != FORMAT or "image_embeddings" not in fh.keys():
                raise EmbeddingFileError(f"{path} is not a SAM image embedding written by "
                                         "--save-embedding")
            embedding = fh.get_tensor("image_embeddings")
    except (SafetensorError, OSError, ValueError) as exc:
        raise EmbeddingFileError(f"{path} is not a readable safetensors file ({exc})") from exc
    if metadata.get("model") != model:
        raise EmbeddingFileError(f"{path} was made by the {metadata.get('model')!r} model, not "
                                 f"{model!r}: pass --model {metadata.get('model')} or make a new "
                                 "one")
    if metadata.get("image_sha256") != image_digest(rgb):
        raise EmbeddingFileError(f"{path} is the embedding of another image (its pixels differ): "
                                 "make one for this image with --save-embedding FILE")
    if embedding.shape != EMBEDDING_SHAPE or embedding.dtype != np.float32:
        raise EmbeddingFileError(f"{path} holds a {embedding.dtype} {embedding.shape} embedding; "
                                 f"SAM's is float32 {EMBEDDING_SHAPE}")
    return ImageEmbedding(embedding, _size(metadata["original_size"]),
                          _size(metadata["input_size"]))


def _size(text: str) -> tuple[int, int]:
    h, w = (int(v) for v in text.split("x"))
    return h, w
