"""``Classifier``: a loaded ResNet as a task, as ``candle-resnet`` runs it:
``resnet.load(weights).predict(source)`` → one :class:`Classification` per image. The file
decides the variant, class count, labels (its ``candle_nn.names``, else ImageNet's for 1000
classes, else numbers) and evaluation size (its ``candle_nn.imgsz``: resize imgsz*256/224,
centre crop; else 256/224)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from candle_nn import CandleNNError, Device, VarBuilder
import mlx.core as mx
import numpy as np

from candle_nn_models.classify_transforms import eval_resize
from candle_nn_models.finite import check_finite
from candle_nn_models.image_file import shown
from candle_nn_models.imagenet import CROP, RESIZE, class_names, preprocess
from candle_nn_models.resnet_network import ResNet, class_probabilities, infer_variant
from candle_nn_models.training_size import training_size
from candle_nn_models.yolo.predict import Source, images_of
from candle_nn_models.yolo.result import top_classes

from candle_nn_models.weights.metadata import WeightsMetadata
from candle_nn_models.weights.registry import resolve_weights
from candle_nn_models.weights.spec import build_model

from .options import PredictOptions

__all__ = ["Classification", "Classifier", "PreparedImage", "eval_size", "forward_probs", "load",
           "open_resnet_weights"]


@dataclass(frozen=True)
class Classification:
    """One image's classes.

    Attributes:
        path: the file it came from (``None`` for an array or PIL image).
        orig_shape: the image's ``(height, width)``.
        probs: ``(num_classes,)`` float32 class probabilities.
        names: one label per class.
        k: how many classes :attr:`top_k` and :meth:`to_json` list.
    """

    path: Path | None
    orig_shape: tuple[int, int]
    probs: np.ndarray
    names: Sequence[str]
    k: int = 5

    @property
    def top_k(self) -> list[tuple[str, float]]:
        """``(label, probability)`` of the ``k`` best classes, best first (ties: lower index)."""
        return [(self.names[i], p) for i, p in top_classes(self.probs, self.k)]

    def to_json(self) -> dict:
        """The record ``candle-resnet --json`` prints for this image: ``image`` and ``top_k``
        (``index``, ``label``, ``probability``)."""
        return {"image": None if self.path is None else shown(self.path),
                "top_k": [{"index": i, "label": self.names[i], "probability": p}
                          for i, p in top_classes(self.probs, self.k)]}


class PreparedImage(NamedTuple):
    """One image ready for the network: where it came from, its ``(height, width)``, and its
    ``(crop, crop, 3)`` float32 ImageNet-normalised input."""

    path: Path | None
    orig_shape: tuple[int, int]
    x: np.ndarray


class Classifier:
    """A ResNet classifier and what it was loaded from.

    Attributes:
        model: the network (:class:`ResNet`), ``names`` one label per class, ``path`` the weights
            file, ``resize``/``crop`` its evaluation transform (shorter side, centre crop).
    """

    def __init__(self, model: ResNet, names: Sequence[str], path: Path, resize: int = RESIZE,
                 crop: int = CROP) -> None:
        self.model, self.names, self.path = model, list(names), path
        self.resize, self.crop = resize, crop

    @property
    def variant(self) -> str:
        return self.model.variant

    def prepare(self, rgb: np.ndarray, path: "Path | None" = None) -> PreparedImage:
        """An ``(H, W, 3)`` uint8 RGB image as the network's input (resize, centre crop,
        ImageNet normalisation)."""
        return PreparedImage(path, (int(rgb.shape[0]), int(rgb.shape[1])),
                             preprocess(rgb, self.resize, self.crop))

    def classify(self, images: Sequence[PreparedImage], top_k: int = 5) -> list[Classification]:
        """One forward over ``images``: their classes (``top_k`` listed). Non-finite outputs are
        an error naming the weights."""
        probs = forward_probs(self.model, np.stack([image.x for image in images]))
        check_finite(probs, self.path)
        k = min(top_k, len(self.names))
        return [Classification(image.path, image.orig_shape, row, self.names, k)
                for image, row in zip(images, probs)]

    def predict(self, source: Source, **options: Any) -> list[Classification]:
        """One :class:`Classification` per image of ``source``: a path, a folder, a glob, a PIL
        image, an ``(H, W, 3)`` uint8 RGB NumPy array, an ``mx.array`` image or ``(N, H, W, 3)``
        batch, or a list of those. ``options``: :class:`PredictOptions` (``top_k=5``,
        ``batch_size=8`` images a forward, ``max_pixels``)."""
        opts = PredictOptions.from_keywords(options)
        results: list[Classification] = []
        pending: list[PreparedImage] = []
        for path, rgb in images_of(source, opts.max_pixels):
            pending.append(self.prepare(rgb, path))
            if len(pending) == opts.batch_size:
                results += self.classify(pending, opts.top_k)
                pending = []
        return results + (self.classify(pending, opts.top_k) if pending else [])

    def __repr__(self) -> str:
        return f"Classifier({self.variant}, {len(self.names)} classes, {str(self.path)!r})"


def forward_probs(model: ResNet, x: np.ndarray) -> np.ndarray:
    """``(N, num_classes)`` float32 probabilities of a prepared ``(N, S, S, 3)`` batch."""
    with model.on_device():
        return np.array(class_probabilities(model(mx.array(x))))


def eval_size(vb: VarBuilder, path: Path) -> tuple[int, int]:
    """``(resize, crop)`` of the evaluation transform of the file ``path`` (read through
    ``vb``): 256/224, or a trained file's own size (``candle_nn.imgsz``, bounded:
    WeightsFileError beyond ``MAX_IMGSZ``)."""
    size = training_size(vb.metadata, shown(path))
    return (eval_resize(size), size) if size is not None else (RESIZE, CROP)


def open_resnet_weights(weights: "str | os.PathLike | None", variant: str | None,
                        device: Device) -> tuple[VarBuilder, str, int | None, Path]:
    """``(vb, variant, num_classes, path)`` of ``weights`` (default: the published ``variant``,
    resnet18 without one); ``num_classes`` is ``None`` for a headless file. Raises CandleNNError
    when the file holds another variant than ``variant``."""
    path = resolve_weights("resnet", variant or "resnet18", weights)
    vb = VarBuilder.from_safetensors(path, device=device)
    found, num_classes = infer_variant(vb, name=str(path))
    if variant is not None and variant != found:
        raise CandleNNError(f"{path} holds {found} weights, not {variant}: drop --variant to use "
                            f"them, or pass {variant} weights with --weights")
    return vb, found, num_classes, path


def read_labels(path: "str | os.PathLike", num_classes: int, weights: Path) -> list[str]:
    """The class names in ``path`` (one a line, blank lines ignored), ``num_classes`` of them."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CandleNNError(f"cannot read --labels {path}: "
                            f"{getattr(exc, 'strerror', None) or exc}") from None
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if len(names) != num_classes:
        raise CandleNNError(f"--labels {path} has {len(names)} names, but {shown(weights)} "
                            f"classifies into {num_classes} classes; pass the labels.txt written "
                            "with these weights")
    return names


def load(weights: "str | os.PathLike | None" = None, device: "str | Device | None" = None, *,
         variant: str | None = None, labels: "str | os.PathLike | None" = None) -> Classifier:
    """The ResNet classifier in ``weights`` (a safetensors file in candle's layout; default:
    candle's published ``{variant}.safetensors``, resnet18 without ``variant``, fetched once from
    the Hugging Face hub) on ``device`` (``"cpu"``, ``"gpu"``, ``"gpu:N"``, a
    :class:`~candle_nn.Device`; default ``Device.default()``). ``variant``: the file must hold it.
    ``labels``: a file of class names, one a line (``candle-resnet train``'s labels.txt); default
    the file's own, else ImageNet's for 1000 classes, else the class numbers."""
    device = Device.default() if device is None else Device.parse(device)
    vb, found, num_classes, path = open_resnet_weights(weights, variant, device)
    if num_classes is None:
        raise CandleNNError(f"{path} holds a headless {found} (no fc layer): it cannot classify")
    names = WeightsMetadata.from_dict(vb.metadata).names
    if labels is not None:
        names = read_labels(labels, num_classes, path)
    elif not names or len(names) != num_classes:
        names = list(class_names()) if num_classes == 1000 else [str(i) for i in range(num_classes)]
    return Classifier(build_model("resnet", found, vb, num_classes=num_classes), names, path,
                      *eval_size(vb, path))
