"""What each model contributes to a ``candle-nn-batch`` job: host-side preprocessing of one image
(run in Ray tasks), loading (once per actor) and batched prediction, and the typed Arrow schema of
its output columns.

Every job's rows start with ``path`` (absolute), ``width``, ``height`` and ``error`` (null unless
the image failed; then the model columns are null). Preprocessing and postprocessing are the plain
CLIs' own (``candle_nn_models.imagenet.preprocess``, the YOLO task API's ``model_input`` and
``YOLO.predict_letterboxed``, ``SamPredictor``), and models load through the CLIs' loaders, so
a batch job gives the same numbers as ``candle-resnet`` / ``candle-yolo-v8 --square`` /
``SamPredictor`` on the same image (YOLO: each row's ``detections`` are ``Result.to_json()``'s).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from candle_nn import CandleNNError, Device, VarBuilder
import mlx.core as mx
import numpy as np
import pyarrow as pa

from candle_nn_models.classify_transforms import eval_resize
from candle_nn_models.imagenet import CROP, preprocess as imagenet_preprocess
from candle_nn_models.letterbox import Letterbox
from candle_nn_models.segment_anything import Sam, SamPredictor
from candle_nn_models.segment_anything.transforms import ResizeLongestSide
from candle_nn_models.training_size import DEFAULT_SIZE, default_size
from candle_nn_models.yolo.predict import model_input

BASE_FIELDS = [pa.field("path", pa.string(), nullable=False), pa.field("width", pa.int32()),
               pa.field("height", pa.int32()), pa.field("error", pa.string())]


@dataclass(frozen=True)
class JobOptions:
    """The model-related command-line options of a job (picklable: it travels to every actor).

    :func:`identify` fills in ``variant`` and ``weights_sha256`` from the weights the driver
    loads; every actor then checks that it loaded a file with that digest."""

    model: str                  # resnet | yolo_v8 | yolo_v8_pose | segment_anything
    weights: str | None         # None: candle's published checkpoint (each node resolves it)
    variant: str | None = None  # None: what the weights hold (SAM: tiny)
    top_k: int = 5
    conf: float = 0.25
    iou: float = 0.7            # ultralytics' default
    size: int | None = None     # None: the size the weights were trained at (identify)
    weights_sha256: str | None = None

    @property
    def weights_label(self) -> str:
        """The weights as a message names them."""
        return self.weights or "the published checkpoint"


class BatchModel:
    """One model's part of a batch job. Subclasses set ``name``, ``input_shape``/``input_dtype``
    (one preprocessed image), ``output_fields`` and ``row_options`` (the options that change a
    row), and implement ``preprocess``, ``_load`` and ``predict``."""

    name: ClassVar[str]
    input_dtype: ClassVar[type] = np.float32
    extras: ClassVar[tuple[str, ...]] = ()  # the per-image numbers ``preprocess`` returns
    output_fields: ClassVar[list[pa.Field]]
    row_options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: JobOptions) -> None:
        self.options = options
        self.variant: str | None = None       # once loaded: the variant the weights hold
        self.weights_file: Path | None = None
        self.weights_sha256: str | None = None

    def identity(self) -> dict[str, Any]:
        """What produces this job's rows (options as :func:`identify` returns them): model,
        variant, the weights' SHA-256 and the options that change a row. A resumed job must have
        the same."""
        return {"model": self.name, "variant": self.options.variant,
                "weights_sha256": self.options.weights_sha256,
                **{k: getattr(self.options, k) for k in self.row_options}}

    @property
    def input_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def trained_size(self) -> int | None:
        """The input size the weights were trained at (read from the file's header, nothing
        loaded): the job's default size."""
        return None

    def schema(self) -> pa.Schema:
        """The Arrow (and Parquet) schema of an output row."""
        return pa.schema(BASE_FIELDS + self.output_fields)

    def preprocess(self, rgb: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """``(H, W, 3)`` uint8 → ``(input_shape)`` array and the per-image numbers named in
        ``extras`` that postprocessing needs (e.g. the letterbox's scale)."""
        raise NotImplementedError

    def load(self, device: Device) -> None:
        """Load the weights onto ``device`` (once per actor); CandleNNError for bad weights, or
        for a file whose SHA-256 is not ``options.weights_sha256`` (replaced since the job
        started, or another file at that path on this node)."""
        path, self.variant = self._load(device)
        self.weights_file, self.weights_sha256 = path, file_sha256(path)
        want = self.options.weights_sha256
        if want is not None and self.weights_sha256 != want:
            raise CandleNNError(
                f"{path} is not the weights this job started with (SHA-256 "
                f"{self.weights_sha256[:12]}…, expected {want[:12]}…): it was replaced, or "
                "another file has that path on this node; rerun with the same file")

    def _load(self, device: Device) -> tuple[Path, str]:
        """Load the model; returns the weights file and the variant it holds."""
        raise NotImplementedError

    def predict(self, inputs: np.ndarray, extras: dict[str, np.ndarray],
                sizes_hw: np.ndarray) -> list[dict[str, Any]]:
        """Model columns for a batch: ``inputs`` ``(N, *input_shape)``, ``extras`` columns of
        length N, ``sizes_hw`` ``(N, 2)`` original heights and widths → N dicts."""
        raise NotImplementedError


class ResNetBatch(BatchModel):
    """ImageNet-style classification: ``top_k`` = [{index, label, probability}], best first."""

    name = "resnet"
    row_options = ("top_k", "size")
    output_fields = [pa.field("top_k", pa.list_(pa.struct([
        ("index", pa.int32()), ("label", pa.string()), ("probability", pa.float32())])))]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.options.size, self.options.size, 3)

    def preprocess(self, rgb):
        size = self.options.size  # candle-resnet's transform at the training size
        return imagenet_preprocess(rgb, eval_resize(size), size), {}

    def trained_size(self):
        from candle_nn_models.scripts.resnet import image_size

        return image_size(Path(self.options.weights))[1] if self.options.weights else CROP

    def _load(self, device):
        from candle_nn_models.scripts.resnet import load_classifier

        self.model, self.names, path = load_classifier(self.options.weights,
                                                       self.options.variant, device)
        return path, self.model.variant

    def predict(self, inputs, extras, sizes_hw):
        from candle_nn_models.scripts.resnet import top_k_probabilities

        best = top_k_probabilities(self.model, inputs, min(self.options.top_k, len(self.names)))
        return [{"top_k": [{"index": i, "label": self.names[i], "probability": p}
                           for i, p in row]} for row in best]


class YoloBatch(BatchModel):
    """Detection (and pose): ``detections`` = [{class_id, class_name, score, box_xyxy[4],
    keypoints[K][3]}] in original-image pixels, letterboxed to a ``size``² square: the
    ``detections`` of the image's ``Result.to_json()`` (``YOLO.predict(image, square=True)``),
    the prediction checked finite."""

    name = "yolo_v8"
    task = "detect"
    input_dtype = np.uint8
    extras = ("scale", "pad_x", "pad_y")
    row_options = ("conf", "iou", "size")
    _detection = [("class_id", pa.int32()), ("class_name", pa.string()), ("score", pa.float32()),
                  ("box_xyxy", pa.list_(pa.float32(), 4))]
    output_fields = [pa.field("detections", pa.list_(pa.struct(_detection)))]

    @property
    def input_shape(self):
        return (self.options.size, self.options.size, 3)

    def preprocess(self, rgb):
        # square: every input of a batch has one shape
        lb = model_input(rgb, self.options.size, square=True)
        return lb.image, {"scale": lb.scale, "pad_x": lb.pad[0], "pad_y": lb.pad[1]}

    def _load(self, device):
        from candle_nn_models.scripts.yolo_v8_weights import load_yolo

        self.model = load_yolo(self.options.weights, self.task, self.options.variant, device)
        return self.model.path, self.model.spec.variant

    def trained_size(self):
        if self.options.weights is None:  # candle's published files record no size
            return DEFAULT_SIZE
        metadata = VarBuilder.from_safetensors(self.options.weights).metadata
        return default_size(metadata, self.task, self.options.weights)

    def predict(self, inputs, extras, sizes_hw):
        boxes = [Letterbox(image, float(scale), (int(px), int(py)), (int(h), int(w)))
                 for image, scale, px, py, (h, w) in zip(
                     inputs, extras["scale"], extras["pad_x"], extras["pad_y"], sizes_hw)]
        results = self.model.predict_letterboxed(boxes, conf=self.options.conf,
                                                 iou=self.options.iou, imgsz=self.options.size,
                                                 square=True)
        return [{"detections": r.to_json()["detections"]} for r in results]


class YoloPoseBatch(YoloBatch):
    """As :class:`YoloBatch`, plus ``keypoints`` ``(K, 3)`` x, y, visibility per detection."""

    name = "yolo_v8_pose"
    task = "pose"
    output_fields = [pa.field("detections", pa.list_(pa.struct(
        YoloBatch._detection + [("keypoints", pa.list_(pa.list_(pa.float32(), 3)))])))]


class SamBatch(BatchModel):
    """Segment the object under the image centre (one foreground point, SAM's three candidate
    masks): ``point_xy`` and ``masks`` = [{size [h, w], counts (COCO compressed RLE), iou,
    area}], in SAM's output order."""

    name = "segment_anything"
    input_dtype = np.uint8
    extras = ("input_h", "input_w")
    output_fields = [
        # (x, y); a variable-size list: an error row's null fixed-size list reads back as a
        # broken table in the H100 image's pyarrow ("Expected all lists to be of size=2")
        pa.field("point_xy", pa.list_(pa.float32())),
        pa.field("masks", pa.list_(pa.struct([
            ("size", pa.list_(pa.int32(), 2)), ("counts", pa.string()),
            ("iou", pa.float32()), ("area", pa.int64())])))]

    @property
    def input_shape(self):
        return (Sam.image_size, Sam.image_size, 3)

    def preprocess(self, rgb):
        resized = ResizeLongestSide(Sam.image_size).apply_image(rgb)
        h, w = resized.shape[:2]
        padded = np.zeros(self.input_shape, dtype=np.uint8)  # one shape per batch; cropped back
        padded[:h, :w] = resized
        return padded, {"input_h": h, "input_w": w}

    def _load(self, device):
        from candle_nn_models.scripts.segment_anything import MODELS, load_sam

        variant = self.options.variant
        if variant is not None and variant not in MODELS:
            raise CandleNNError(f"--variant {variant}: segment_anything is one of "
                                f"{', '.join(MODELS)}")
        sam, path, variant = load_sam(variant, self.options.weights, device)
        self.predictor = SamPredictor(sam)
        return path, variant

    def predict(self, inputs, extras, sizes_hw):
        from pycocotools import mask as mask_utils

        sam, rows = self.predictor.model, []
        for image, h, w, (height, width) in zip(inputs, extras["input_h"].astype(int),
                                                extras["input_w"].astype(int), sizes_hw):
            self.predictor.set_preprocessed_image(
                sam.preprocess(mx.array(image[:h, :w])[None]), (height, width), (h, w))
            point = center_point(int(height), int(width))
            masks, ious, _ = self.predictor.predict(point_coords=point[None],
                                                    point_labels=np.array([1]),
                                                    multimask_output=True)
            rles = [mask_utils.encode(np.asfortranarray(m.astype(np.uint8))) for m in masks]
            rows.append({"point_xy": point.tolist(), "masks": [
                {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii"),
                 "iou": float(iou), "area": int(m.sum())}
                for rle, iou, m in zip(rles, ious, masks)]})
        return rows


def file_sha256(path: "str | Path") -> str:
    """The SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def center_point(height: int, width: int) -> np.ndarray:
    """The prompt of a SAM batch job: ``(x, y)`` float32 at the image centre."""
    return np.array([width / 2, height / 2], dtype=np.float32)


BATCH_MODELS: dict[str, type[BatchModel]] = {
    cls.name: cls for cls in (ResNetBatch, YoloBatch, YoloPoseBatch, SamBatch)}


def identify(options: JobOptions) -> tuple[JobOptions, BatchModel]:
    """Load the model on the CPU (bad weights: one CandleNNError here, not in the actors) and
    return ``options`` with the variant, the weights' SHA-256 and (unless given) the size the
    weights were trained at filled in, and the model."""
    model = batch_model(options)
    model.load(Device.cpu())
    return with_size(replace(options, variant=model.variant,
                             weights_sha256=model.weights_sha256)), model


def with_size(options: JobOptions) -> JobOptions:
    """``options`` with ``size`` (unless given) the size the weights were trained at."""
    if options.size is not None:
        return options
    return replace(options, size=batch_model(options).trained_size())


def batch_model(options: JobOptions) -> BatchModel:
    """The :class:`BatchModel` for ``options.model``."""
    try:
        return BATCH_MODELS[options.model](options)
    except KeyError:
        raise CandleNNError(f"unknown model {options.model!r}: use one of "
                            f"{', '.join(BATCH_MODELS)}") from None
