"""Image embeddings on disk: run SAM's encoder once, prompt the image again later.

A safetensors file with one tensor, ``image_embeddings`` ``(1, 64, 64, 256)`` float32 NHWC, and
metadata: the image's original and resized sizes, the model that made it (``tiny``, ``vit_b``,
...), and a SHA-256 of the image's RGB pixels so that the embedding is never applied to another
image by mistake.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

from candle_nn import CandleNNError

from .predictor import SamPredictor

FORMAT = "candle_nn.sam_image_embedding.v1"


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
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=folder)
    except OSError as exc:
        raise EmbeddingFileError(f"cannot write {path}: {exc.strerror or exc}") from exc
    os.close(fd)
    try:
        save_file({"image_embeddings": embedding}, tmp, metadata=metadata)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(exc, OSError):
            raise EmbeddingFileError(f"cannot write {path}: {exc.strerror or exc}") from exc
        raise
    return path


def load_image_embedding(predictor: SamPredictor, path: "str | os.PathLike", model: str,
                         rgb: np.ndarray) -> None:
    """Set the predictor's image from an embedding file made by :func:`save_image_embedding`
    for this ``model`` and this very image (EmbeddingFileError otherwise); no encoder run."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise EmbeddingFileError(f"embedding file not found: {path} (make one with "
                                 "--save-embedding FILE)")
    try:
        with safe_open(str(path), framework="numpy") as fh:
            metadata = fh.metadata() or {}
            if metadata.get("format") != FORMAT or "image_embeddings" not in fh.keys():
                raise EmbeddingFileError(f"{path} is not a SAM image embedding written by "
                                         "--save-embedding")
            embedding = fh.get_tensor("image_embeddings")
    except (SafetensorError, OSError, ValueError) as exc:
        raise EmbeddingFileError(f"{path} is not a readable safetensors file ({exc})") from exc
    if metadata["model"] != model:
        raise EmbeddingFileError(f"{path} was made by the {metadata['model']!r} model, not "
                                 f"{model!r}: pass --model {metadata['model']} or make a new one")
    if metadata["image_sha256"] != image_digest(rgb):
        raise EmbeddingFileError(f"{path} is the embedding of another image (its pixels differ): "
                                 "make one for this image with --save-embedding FILE")
    expected = tuple(predictor.model.get_dense_pe().shape)
    if embedding.shape != expected or embedding.dtype != np.float32:
        raise EmbeddingFileError(f"{path} holds a {embedding.dtype} {embedding.shape} embedding; "
                                 f"this model needs float32 {expected}")
    original = tuple(int(v) for v in metadata["original_size"].split("x"))
    predictor.reset_image()
    predictor.features = mx.array(embedding)
    predictor.original_size = original
    predictor.input_size = tuple(int(v) for v in metadata["input_size"].split("x"))
    predictor.is_image_set = True
