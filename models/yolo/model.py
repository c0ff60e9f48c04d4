"""``YOLO``: a loaded YOLOv8 or YOLO11 model (detect, pose, segment or classify) as a task, as
ultralytics' ``YOLO(...)``: ``yolo.load(weights).predict(source)`` → one :class:`Result` per
image; ``.val(data="data.yaml")`` → a detector's validation metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from candle_nn import CandleNNError, Device, check_weights_path, model_dtype
import mlx.core as mx
import numpy as np

from candle_nn.inputs import check_rgb_image

from candle_nn_models.coco import COCO_SKELETON
from candle_nn_models.letterbox import Letterbox
from candle_nn_models.yolo_checkpoint import YoloModel
from candle_nn_models.yolo_v8 import YoloV8Spec
from candle_nn_models.yolo_v8_metrics import DetectionResults

from candle_nn_models.weights.registry import resolve_weights

from .load import load_file, published_weights
from .options import PredictOptions
from .predict import Source, classify_probs, detect_batch, images_of, model_input
from .result import Result
from .val import VAL_BATCH, VAL_CONF, VAL_IMGSZ, VAL_IOU, VAL_MAX_DET, validate

__all__ = ["YOLO", "load"]


class YOLO:
    """A YOLO model and what it was loaded from.

    Attributes:
        model: the network (a ``candle_nn.Module``), ``spec`` its :class:`YoloV8Spec` (``task``,
            ``variant``, class, keypoint and mask counts), ``names`` one name per class,
            ``path`` the weights file, ``imgsz`` the size it predicts at by default (the
            file's training size, else 640; classify: 224).
    """

    def __init__(self, model: YoloModel, spec: YoloV8Spec, names: list[str], path: Path) -> None:
        self.model, self.spec, self.names, self.path = model, spec, names, path
        self._models = {model_dtype(model): model}  # predict(half=...) loads the other once

    @property
    def task(self) -> str:
        return self.spec.task

    @property
    def imgsz(self) -> int:
        return self.model.imgsz

    @property
    def skeleton(self) -> tuple[tuple[int, int], ...]:
        """The keypoint pairs drawn as limbs: COCO's for a 17-keypoint pose model."""
        return tuple(COCO_SKELETON) if self.task == "pose" and self.spec.num_keypoints == 17 \
            else ()

    def options(self, **options: Any) -> PredictOptions:
        """``predict``'s keyword arguments as checked :class:`PredictOptions`, ``classes``
        against this model's class count."""
        opts = PredictOptions.from_keywords(options)
        if opts.classes and max(opts.classes) >= self.spec.num_classes:
            n = self.spec.num_classes
            raise CandleNNError(f"--classes {max(opts.classes)}: the model has {n} classes "
                                f"(0..{n - 1})")
        return opts

    def predict(self, source: Source, **options: Any) -> list[Result]:
        """One :class:`Result` per image of ``source``: a path, a folder, a glob, a PIL image,
        an ``(H, W, 3)`` uint8 RGB NumPy array, an ``mx.array`` image or ``(N, H, W, 3)``
        batch, or a list of those. ``options``: :class:`PredictOptions` (``conf=0.25``,
        ``iou=0.7``, ``imgsz=None``: the model's, ``classes``, ``max_det=300``,
        ``agnostic_nms``, ``half``, ``retina_masks``, ``square``, ``top_k=5``,
        ``max_pixels``). Images are read and run one at a time."""
        opts = self.options(**options)
        model = self._model(mx.float16 if opts.half else mx.float32)
        size = opts.imgsz or self.imgsz
        results = []
        for path, rgb in images_of(source, opts.max_pixels):
            if self.task == "classify":
                probs = classify_probs(model, rgb, size, self.path)
                results.append(Result(rgb, path, self.names, probs=probs, top_k=opts.top_k))
                continue
            results += self._detect([model_input(rgb, size, opts.square)], opts, [rgb], [path])
        return results

    def predict_batch(self, images: Sequence[np.ndarray], **options: Any) -> list[Result]:
        """One :class:`Result` per image of ``images``, ``(H, W, 3)`` uint8 RGB arrays of one
        shape (a video's frames), in one forward pass; detect, pose and segment models;
        ``options`` as :meth:`predict`'s."""
        opts = self._detect_options(options)
        size = opts.imgsz or self.imgsz
        rgbs = [check_rgb_image(rgb, where="predict_batch") for rgb in images]
        return self._detect([model_input(rgb, size, opts.square) for rgb in rgbs], opts, rgbs,
                            [None] * len(rgbs))

    def predict_letterboxed(self, boxes: Sequence[Letterbox], **options: Any) -> list[Result]:
        """:meth:`predict_batch` for images letterboxed already, by
        :func:`~candle_nn_models.yolo.predict.model_input` with this ``imgsz`` and ``square``
        (candle-nn-batch's Ray tasks do it away from the model): one Result per letterbox, with
        the original's size (``orig_shape``) and no image to plot."""
        return self._detect(list(boxes), self._detect_options(options), [None] * len(boxes),
                            [None] * len(boxes))

    def _detect_options(self, options: dict[str, Any]) -> PredictOptions:
        if self.task == "classify":
            raise CandleNNError(f"{self.path} holds {self.spec}, a classifier: predict_batch and "
                                "predict_letterboxed run detect, pose and segment models; "
                                "classify with predict")
        return self.options(**options)

    def _detect(self, boxes: list[Letterbox], opts: PredictOptions, images: list,
                paths: list) -> list[Result]:
        """The detections of letterboxed ``boxes`` (one forward pass) as Results."""
        if not boxes:
            raise CandleNNError("no images to predict: pass at least one")
        model = self._model(mx.float16 if opts.half else mx.float32)
        found = detect_batch(model, self.spec, boxes, opts, self.path)
        return [Result(rgb, path, self.names, detections, masks, skeleton=self.skeleton,
                       orig_hw=lb.orig_hw if rgb is None else None)
                for lb, rgb, path, (detections, masks) in zip(boxes, images, paths, found)]

    def val(self, data: "str | Path", *, split: str = "val", imgsz: int | None = VAL_IMGSZ,
            batch: int = VAL_BATCH, conf: float = VAL_CONF, iou: float = VAL_IOU,
            max_det: int = VAL_MAX_DET, half: bool = False,
            warn: Callable[[str], None] | None = None) -> DetectionResults:
        """A detector's P, R, mAP50 and mAP50-95 (overall and per class, ultralytics'
        validation metrics) on the ``split`` of ``data`` (a data.yaml, see
        ``models/yolo_v8_data.py``): each image letterboxed to ``imgsz`` square (``None``: the
        size the weights were trained at), ``batch`` images a forward pass, ultralytics'
        validation NMS (``conf``, ``iou``, ``max_det``). ``warn(message)`` gets each skipped
        image and malformed label line (default: a ``warning:`` line on stderr).
        ``results.table()`` is ultralytics' printout, ``results.to_dict()`` what
        ``candle-yolo-v8 val --json`` prints."""
        if self.task != "detect":
            raise CandleNNError(f"{self.path} holds {self.spec}: val scores detectors; pass a "
                                "detect model's weights")
        model = self._model(mx.float16 if half else mx.float32)
        return validate(model, self.spec.num_classes, self.path, data, split=split,
                        imgsz=imgsz or self.imgsz, batch=batch, conf=conf, iou=iou,
                        max_det=max_det, **({} if warn is None else {"warn": warn}))

    def _model(self, dtype: mx.Dtype):
        """The network in ``dtype``: loaded from the file (as ``load(..., half=)`` does) the
        first time another dtype than the loaded one is asked for."""
        if dtype not in self._models:
            name = "float16" if dtype == mx.float16 else "float32"
            model, _, _ = load_file(self.path, self.task, self.spec.variant, self.model.device,
                                    name)
            model.set_compiled(self.model.compiled)
            self._models[dtype] = model
        return self._models[dtype]

    def __repr__(self) -> str:
        return f"YOLO({self.spec}, {str(self.path)!r})"


def load(weights: "str | Path | None" = None, device: "str | Device | None" = None, *,
         task: str | None = None, variant: str | None = None, half: bool = False) -> YOLO:
    """The YOLO model in ``weights`` (a YOLOv8 or YOLO11 safetensors file: task, variant,
    classes and names, training size from the file; default: candle's published
    ``yolov8{variant}[-pose]`` checkpoint, fetched once from the Hugging Face hub) on ``device``
    (``"cpu"``, ``"gpu"``, ``"gpu:N"``, a :class:`~candle_nn.Device`; default
    ``Device.default()``), in float16 with ``half``. ``task``/``variant``: the file must hold
    them (a mismatch is an error)."""
    device = Device.default() if device is None else Device.parse(device)
    if weights is None:  # the published file, which must then be exactly what was asked for
        registry, task, variant = published_weights(task, variant)
        path = resolve_weights(registry, variant)
    else:
        path = Path(check_weights_path(weights))
    model, spec, names = load_file(path, task, variant, device,
                                   "float16" if half else "float32")
    return YOLO(model, spec, names, path)
