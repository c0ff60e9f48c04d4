"""Which YOLO a checkpoint holds, and loading it: YOLOv8 under candle's names
(:mod:`candle_nn_models.yolo_v8`) or YOLO11 under ultralytics' (:mod:`candle_nn_models.yolo11`),
told apart by their stem tensor."""

from __future__ import annotations

import candle_nn as cn

from . import yolo11, yolo_v8
from .yolo11 import Yolo11, Yolo11Pose, Yolo11Seg, Yolo11Spec
from .yolo_v8 import YoloV8, YoloV8Cls, YoloV8Pose, YoloV8Seg, YoloV8Spec

YoloModel = YoloV8 | YoloV8Pose | YoloV8Seg | YoloV8Cls | Yolo11 | Yolo11Pose | Yolo11Seg


def infer_spec(vb: cn.VarBuilder, name: str = "the checkpoint") -> YoloV8Spec:
    """The :class:`YoloV8Spec` (a :class:`Yolo11Spec` for YOLO11) of the checkpoint behind
    ``vb``; WeightsFileError (starting with ``name``) when it holds neither."""
    if vb.contains(yolo11.STEM):
        return yolo11.infer_spec(vb, name)
    return yolo_v8.infer_spec(vb, name)


def load_model(vb: cn.VarBuilder, spec: YoloV8Spec | None = None, *,
               fold_bn: bool = True) -> YoloModel:
    """The model ``spec`` describes (default: :func:`infer_spec` of ``vb``), loaded from ``vb``."""
    spec = infer_spec(vb) if spec is None else spec
    if isinstance(spec, Yolo11Spec):
        return yolo11.load_model(vb, spec, fold_bn=fold_bn)
    return yolo_v8.load_model(vb, spec, fold_bn=fold_bn)
