"""YOLO11 object detection, pose estimation, instance segmentation and classification (sizes
n/s/m/l/x), NHWC, with ultralytics' names.

candle has no YOLO11, so tensor names are ultralytics' module names (``yolo11.yaml``'s layer
indices), as in its ``.pt`` files and ``state_dict``::

    model.0  model.1                        stem: two stride-2 ConvBlocks
    model.2 … model.4                       C3k2, stride-2 ConvBlock, C3k2       → p3 (stride 8)
    model.5  model.6                        stride-2 ConvBlock, C3k2             → p4 (stride 16)
    model.7 … model.10                      stride-2 ConvBlock, C3k2, SPPF, C2PSA → p5 (stride 32)
    model.13 model.16 model.17 model.19     PAN neck: C3k2, C3k2, ConvBlock, C3k2,
    model.20 model.22                       ConvBlock, C3k2 (11, 12, 14, 15, 18, 21 hold nothing)
    model.23                                Detect / Pose / Segment head (cv2, cv3 depthwise, dfl;
                                            pose: cv4 keypoints; segment: cv4 mask coefficients,
                                            proto)

A classifier (``yolo11-cls.yaml``, :class:`Yolo11Cls`) has layers 0–8, a C2PSA at ``model.9``
and ultralytics' ``Classify`` head at ``model.10`` (``conv``, ``linear``).

Usage::

    vb = cn.VarBuilder.from_safetensors("yolo11n.safetensors")  # candle-nn-weights convert
    model = Yolo11.load(vb, "n", num_classes=80)
    pred = model(images)  # images (N, H, W, 3) in [0, 1], H and W multiples of 32
    # pred (N, 4 + 80, anchors): xywh in input pixels, then class scores (as YoloV8's)

The models share YOLOv8's input checks, outputs and ``train()``-mode raw head outputs, so
:mod:`candle_nn_models.yolo_v8_post` and the ``candle-yolo-v8`` command work on them unchanged;
:func:`infer_spec` reads the variant, task and class count from a checkpoint's tensor shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import candle_nn as cn
import mlx.core as mx

from .yolo11_blocks import C2PSA, C3k2
from .yolo_pan_neck import pan_forward
from .yolo_v8 import YoloV8Seg, YoloV8Spec, _YoloV8Base
from .yolo_v8_blocks import ConvBlock, Sppf
from .yolo_v8_classify import ClassifyBackbone, ClassifyHead, YoloV8Cls
from .yolo_v8_head import DetectionHead, PoseHead
from .yolo_v8_segment_head import SegmentHead, proto_channels
from .training_size import with_training_input

__all__ = ["SCALES", "Scale", "Yolo11Backbone", "Yolo11Neck", "Yolo11", "Yolo11Pose", "Yolo11Seg",
           "Yolo11Cls", "Yolo11Spec", "infer_spec", "load_model", "trunk", "STEM"]


@dataclass(frozen=True)
class Scale:
    """One size: ultralytics' ``[depth, width, max_channels]`` of ``yolo11.yaml``, and whether
    every C3k2 holds C3k blocks (ultralytics sets ``c3k=True`` for m, l and x)."""

    depth: float
    width: float
    max_channels: int
    c3k: bool

    def channels(self, base: int) -> int:
        """ultralytics' ``make_divisible(min(base, max_channels) * width, 8)``."""
        return math.ceil(min(base, self.max_channels) * self.width / 8) * 8

    def repeats(self, base: int) -> int:
        return max(round(base * self.depth), 1) if base > 1 else base

    def filters(self) -> tuple[int, int, int]:
        """Channels of the neck's p3, p4, p5 outputs."""
        return self.channels(256), self.channels(512), self.channels(1024)


SCALES: dict[str, Scale] = {
    "n": Scale(depth=0.50, width=0.25, max_channels=1024, c3k=False),
    "s": Scale(depth=0.50, width=0.50, max_channels=1024, c3k=False),
    "m": Scale(depth=0.50, width=1.00, max_channels=512, c3k=True),
    "l": Scale(depth=1.00, width=1.00, max_channels=512, c3k=True),
    "x": Scale(depth=1.00, width=1.50, max_channels=512, c3k=True),
}


def scale(variant: str) -> Scale:
    if variant not in SCALES:
        raise ValueError(f"unknown YOLO11 variant {variant!r}; choose one of {', '.join(SCALES)}")
    return SCALES[variant]


def trunk(vb: cn.VarBuilder, s: Scale, fold_bn: bool = True) -> list[cn.Module]:
    """Layers 0–8, shared by every YOLO11 task: ``(N, H, W, 3)`` → ``(N, H/32, W/32,
    c(1024))`` (``vb``: the model's ``model`` prefix)."""
    c, n, f, k = s.channels, s.repeats(2), fold_bn, s.c3k
    return [
        ConvBlock.load(vb.pp(0), 3, c(64), 3, 2, f),
        ConvBlock.load(vb.pp(1), c(64), c(128), 3, 2, f),
        C3k2.load(vb.pp(2), c(128), c(256), n, k, 0.25, fold_bn=f),
        ConvBlock.load(vb.pp(3), c(256), c(256), 3, 2, f),
        C3k2.load(vb.pp(4), c(256), c(512), n, k, 0.25, fold_bn=f),
        ConvBlock.load(vb.pp(5), c(512), c(512), 3, 2, f),
        C3k2.load(vb.pp(6), c(512), c(512), n, True, fold_bn=f),
        ConvBlock.load(vb.pp(7), c(512), c(1024), 3, 2, f),
        C3k2.load(vb.pp(8), c(1024), c(1024), n, True, fold_bn=f),
    ]


class Yolo11Backbone(cn.Module):
    """Layers 0–10: ``(N, H, W, 3)`` → p3 ``(N, H/8, W/8, c(512))``, p4 ``(N, H/16, W/16,
    c(512))``, p5 ``(N, H/32, W/32, c(1024))`` (``c``: :meth:`Scale.channels`)."""

    def __init__(self, layers: list[cn.Module]) -> None:
        super().__init__(layers[0].device)
        self.layers = layers

    @classmethod
    def load(cls, vb: cn.VarBuilder, s: Scale, fold_bn: bool = True) -> "Yolo11Backbone":
        """``vb``: the model's ``model`` prefix (layers ``0`` … ``10``)."""
        c, n, f = s.channels, s.repeats(2), fold_bn
        return cls([*trunk(vb, s, fold_bn), Sppf.load(vb.pp(9), c(1024), c(1024), 5, f),
                    C2PSA.load(vb.pp(10), c(1024), n, fold_bn=f)])

    def forward(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        outs = []
        for layer in self.layers:
            x = layer(x)
            outs.append(x)
        return outs[4], outs[6], outs[10]


class Yolo11Neck(cn.Module):
    """Layers 11–22, the PAN neck: top-down (upsample + C3k2) then bottom-up (stride-2
    ConvBlock + C3k2). ``(p3, p4, p5)`` → ``(p3', p4', p5')`` of the same sizes, with
    :meth:`Scale.filters` channels."""

    def __init__(self, n13: C3k2, n16: C3k2, n17: ConvBlock, n19: C3k2, n20: ConvBlock,
                 n22: C3k2) -> None:
        super().__init__(n13.device)
        self.n13, self.n16, self.n17, self.n19, self.n20, self.n22 = n13, n16, n17, n19, n20, n22

    @classmethod
    def load(cls, vb: cn.VarBuilder, s: Scale, fold_bn: bool = True) -> "Yolo11Neck":
        """``vb``: the model's ``model`` prefix (layers ``13`` … ``22``)."""
        c, n, f, k = s.channels, s.repeats(2), fold_bn, s.c3k
        return cls(
            n13=C3k2.load(vb.pp(13), c(1024) + c(512), c(512), n, k, fold_bn=f),
            n16=C3k2.load(vb.pp(16), c(512) + c(512), c(256), n, k, fold_bn=f),
            n17=ConvBlock.load(vb.pp(17), c(256), c(256), 3, 2, f),
            n19=C3k2.load(vb.pp(19), c(256) + c(512), c(512), n, k, fold_bn=f),
            n20=ConvBlock.load(vb.pp(20), c(512), c(512), 3, 2, f),
            n22=C3k2.load(vb.pp(22), c(512) + c(1024), c(1024), n, True, fold_bn=f),
        )

    def forward(self, p3: mx.array, p4: mx.array,
                p5: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        return pan_forward(p3, p4, p5, top4=self.n13, top3=self.n16, down3=self.n17,
                           fuse4=self.n19, down4=self.n20, fuse5=self.n22)


class Yolo11(_YoloV8Base):
    """YOLO11 detector: called as :class:`~candle_nn_models.yolo_v8.YoloV8` (same input, output
    ``(N, 4 + num_classes, A)`` and ``train()``-mode raw maps)."""

    @classmethod
    def load(cls, vb: cn.VarBuilder, variant: str = "n", num_classes: int = 80, *,
             fold_bn: bool = True) -> "Yolo11":
        """Build from ``vb`` (ultralytics' ``model.N.*`` names at its root). Raises
        ShapeMismatchError, naming the checkpoint's own variant and class count, when the weights
        are of another model; ``fold_bn`` as ``YoloV8.load``."""
        spec = Yolo11Spec(variant, "detect", num_classes)
        _check_weights(vb, spec)
        s = scale(variant)
        model = cls(Yolo11Backbone.load(vb.pp("model"), s, fold_bn),
                    Yolo11Neck.load(vb.pp("model"), s, fold_bn),
                    DetectionHead.load(vb.pp("model.23"), num_classes, s.filters(), fold_bn,
                                       depthwise_cls=True), spec)
        # a pose or segmentation checkpoint also loads as its detector: its cv4 (and proto) are
        # left unread
        vb.check_all_read(str(spec), unused=("model.23.cv4.*", "model.23.proto.*"))
        return model


class Yolo11Pose(_YoloV8Base):
    """YOLO11 pose estimator: called as :class:`~candle_nn_models.yolo_v8.YoloV8Pose`."""

    @classmethod
    def load(cls, vb: cn.VarBuilder, variant: str = "n", num_keypoints: int = 17,
             num_classes: int = 1, *, fold_bn: bool = True) -> "Yolo11Pose":
        """As :meth:`Yolo11.load`."""
        spec = Yolo11Spec(variant, "pose", num_classes, num_keypoints)
        _check_weights(vb, spec)
        s = scale(variant)
        model = cls(Yolo11Backbone.load(vb.pp("model"), s, fold_bn),
                    Yolo11Neck.load(vb.pp("model"), s, fold_bn),
                    PoseHead.load(vb.pp("model.23"), num_classes, num_keypoints, s.filters(),
                                  fold_bn, depthwise_cls=True), spec)
        vb.check_all_read(str(spec))
        return model


class Yolo11Seg(YoloV8Seg):
    """YOLO11 instance segmentation: called as :class:`~candle_nn_models.yolo_v8.YoloV8Seg`
    (``(pred, protos)``; masks by :func:`candle_nn_models.yolo_v8_masks.process_mask`)."""

    @classmethod
    def load(cls, vb: cn.VarBuilder, variant: str = "n", num_classes: int = 80,
             num_masks: int = 32, *, fold_bn: bool = True) -> "Yolo11Seg":
        """As :meth:`Yolo11.load`; the segmentation head (``model.23.cv4``, ``model.23.proto``)
        is YOLOv8's around YOLO11's detection head."""
        spec = Yolo11Spec(variant, "segment", num_classes, num_masks=num_masks)
        _check_weights(vb, spec)
        s = scale(variant)
        head_vb = vb.pp("model.23")
        detect = DetectionHead.load(head_vb, num_classes, s.filters(), fold_bn, depthwise_cls=True)
        head = SegmentHead.load(head_vb, num_classes, s.filters(), num_masks,
                                proto_channels(s.width, s.max_channels), fold_bn, detect=detect)
        model = cls(Yolo11Backbone.load(vb.pp("model"), s, fold_bn),
                    Yolo11Neck.load(vb.pp("model"), s, fold_bn), head, spec)
        vb.check_all_read(str(spec))
        return model


class Yolo11Cls(YoloV8Cls):
    """YOLO11 classifier (``yolo11-cls.yaml``): layers 0–8 (:func:`trunk`), a C2PSA at
    ``model.9`` and ultralytics' ``Classify`` head at ``model.10``; called as
    :class:`~candle_nn_models.yolo_v8_classify.YoloV8Cls` (``(N, H, W, 3)`` in [0, 1] →
    probabilities ``(N, num_classes)``; logits in ``train()``)."""

    @classmethod
    def load(cls, vb: cn.VarBuilder, variant: str = "n", num_classes: int = 1000, *,
             fold_bn: bool = True) -> "Yolo11Cls":
        """As :meth:`Yolo11.load`."""
        spec = Yolo11Spec(variant, "classify", num_classes)
        _check_weights(vb, spec)
        s = scale(variant)
        mvb = vb.pp("model")
        net = ClassifyBackbone([*trunk(mvb, s, fold_bn),
                                C2PSA.load(mvb.pp(9), s.channels(1024), s.repeats(2),
                                           fold_bn=fold_bn)])
        model = cls(net, ClassifyHead.load(mvb.pp(_CLS_HEAD), s.channels(1024), num_classes,
                                           fold_bn), variant, num_classes)
        vb.check_all_read(str(spec))
        return model


@dataclass(frozen=True)
class Yolo11Spec(YoloV8Spec):
    """What a YOLO11 checkpoint holds (the fields of :class:`YoloV8Spec`)."""

    def __str__(self) -> str:
        return str(super().__str__()).replace("YOLOv8", "YOLO11", 1)


STEM = "model.0.conv.weight"
_HEAD = "model.23."
_CLS_HEAD = 10  # yolo11-cls.yaml: the Classify layer


def infer_spec(vb: cn.VarBuilder, name: str = "the checkpoint") -> Yolo11Spec:
    """Variant, task and class/keypoint/mask counts of the YOLO11 checkpoint behind ``vb``
    (ultralytics' names), from tensor shapes. Raises WeightsFileError (its message starting with
    ``name``) when ``vb`` holds no YOLO11 detection, pose or segmentation model."""
    if vb.contains(STEM) and vb.contains(f"model.{_CLS_HEAD}.linear.weight") \
            and vb.contains("model.9.m.0.attn.qkv.conv.weight"):
        return Yolo11Spec(_variant(vb, name), "classify",
                          vb.shape(f"model.{_CLS_HEAD}.linear.weight")[0])
    if not vb.contains(STEM) or not vb.contains("model.10.m.0.attn.qkv.conv.weight"):
        raise cn.WeightsFileError(
            f"{name} is not a YOLO11 checkpoint in ultralytics' layout (it has no "
            f"'{vb.path(STEM)}' and C2PSA layer 'model.10')")
    variant = _variant(vb, name)
    if not vb.contains(_HEAD + "cv3.0.2.weight"):
        raise cn.WeightsFileError(f"{name}: no YOLO11 detection head (model.23.cv3.0.2.weight)")
    num_classes = vb.shape(_HEAD + "cv3.0.2.weight")[0]
    if num_classes == 0:
        raise cn.WeightsFileError(f"{name} has an empty detection head (0 classes)")
    if not vb.contains(_HEAD + "cv4.0.2.weight"):
        return Yolo11Spec(variant, "detect", num_classes)
    nk = vb.shape(_HEAD + "cv4.0.2.weight")[0]
    if vb.contains(_HEAD + "proto.cv1.conv.weight"):
        if nk == 0:
            raise cn.WeightsFileError(f"{name} has an empty segmentation head (0 mask channels)")
        return Yolo11Spec(variant, "segment", num_classes, num_masks=nk)
    if nk == 1:
        raise cn.WeightsFileError(f"{name} holds a YOLO11 OBB model (its head's cv4 predicts one "
                                  "rotation angle), which is not supported")
    if nk == 0 or nk % 3:
        raise cn.WeightsFileError(
            f"{name}: pose head with {nk} keypoint channels; only (x, y, visibility) keypoints "
            "(a positive multiple of 3) are supported")
    return Yolo11Spec(variant, "pose", num_classes, nk // 3)


def _variant(vb: cn.VarBuilder, name: str) -> str:
    """The YOLO11 size whose stem width and model.2 depth the checkpoint has."""
    stem = vb.shape(STEM)[0]
    prefix = vb.path("model.2.m.")
    depth = len({n[len(prefix):].split(".")[0] for n in vb.names() if n.startswith(prefix)})
    variant = next((v for v, s in SCALES.items()
                    if s.channels(64) == stem and s.repeats(2) == depth), None)
    if variant is None:
        raise cn.WeightsFileError(
            f"{name}: stem width {stem} with {depth} blocks in model.2 matches no YOLO11 size "
            f"({', '.join(SCALES)})")
    return variant


def _check_weights(vb: cn.VarBuilder, wanted: Yolo11Spec) -> None:
    """As YOLOv8's: both descriptions when a checkpoint is not the model being built; pose and
    segmentation checkpoints also load as plain detectors; a fresh source is not checked."""
    if not vb.contains(STEM):
        return
    found = infer_spec(vb)
    same = (found.variant, found.num_classes) == (wanted.variant, wanted.num_classes)
    if wanted.task != "detect":
        same = same and (found.task, found.num_keypoints, found.num_masks) == (
            wanted.task, wanted.num_keypoints, wanted.num_masks)
    if not same:
        raise cn.ShapeMismatchError(
            f"the weights hold {found}, not {wanted}: build the model the checkpoint holds "
            "(load_model(vb) infers it) or use the weights of the model you want")


def load_model(vb: cn.VarBuilder, spec: Yolo11Spec | None = None, *,
               fold_bn: bool = True) -> Yolo11 | Yolo11Pose | Yolo11Seg | Yolo11Cls:
    """The model ``spec`` describes (default: :func:`infer_spec` of ``vb``), loaded from ``vb``,
    with its training input size as ``model.imgsz``
    (:func:`candle_nn_models.training_size.with_training_input`)."""
    spec = infer_spec(vb) if spec is None else spec
    return with_training_input(_load(vb, spec, fold_bn), vb, spec.task)


def _load(vb: cn.VarBuilder, spec: Yolo11Spec,
          fold_bn: bool) -> Yolo11 | Yolo11Pose | Yolo11Seg | Yolo11Cls:
    if spec.task == "classify":
        return Yolo11Cls.load(vb, spec.variant, spec.num_classes, fold_bn=fold_bn)
    if spec.task == "segment":
        return Yolo11Seg.load(vb, spec.variant, spec.num_classes, spec.num_masks, fold_bn=fold_bn)
    if spec.task == "pose":
        return Yolo11Pose.load(vb, spec.variant, spec.num_keypoints, spec.num_classes,
                               fold_bn=fold_bn)
    return Yolo11.load(vb, spec.variant, spec.num_classes, fold_bn=fold_bn)
