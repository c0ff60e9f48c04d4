"""YOLOv8 object detection and pose estimation (sizes n/s/m/l/x), NHWC, with candle's weights.

Tensor names follow candle's ``candle-examples/examples/yolo-v8/model.rs``::

    net.b1.0  net.b1.1                      stem: two stride-2 ConvBlocks
    net.b2.0  net.b2.1  net.b2.2            C2f, stride-2 ConvBlock, C2f      → p3 (stride 8)
    net.b3.0  net.b3.1                      stride-2 ConvBlock, C2f           → p4 (stride 16)
    net.b4.0  net.b4.1  net.b5.0            stride-2 ConvBlock, C2f, SPPF     → p5 (stride 32)
    fpn.n1 … fpn.n6                         PAN neck: C2f, C2f, ConvBlock, C2f, ConvBlock, C2f
    head.cv2.* head.cv3.* head.dfl.conv     detection head; pose adds head.cv4.*
                                            segmentation adds head.cv4.*, head.proto.* (the
                                            names of ultralytics' Segment: candle has none)

Usage::

    vb = cn.VarBuilder.from_safetensors("yolov8n.safetensors")
    model = YoloV8.load(vb, "n", num_classes=80)
    pred = model(images)  # images (N, H, W, 3) in [0, 1], H and W multiples of 32
    # pred (N, 4 + 80, anchors): xywh in input pixels, then class scores

:func:`infer_spec` reads the variant, task and class count from a checkpoint's tensor shapes, and
:func:`load_model` builds the right model from it (detect, pose, segment, or a classifier:
:mod:`candle_nn_models.yolo_v8_classify`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import candle_nn as cn
import mlx.core as mx

from .yolo_v8_blocks import C2f, ConvBlock, Sppf
from .yolo_v8_classify import YoloV8Cls
from .yolo_v8_head import STRIDES, DetectionHead, PoseHead
from .yolo_pan_neck import pan_forward
from .yolo_v8_multiples import MULTIPLES, Multiples, multiples, variant_of
from .yolo_v8_segment_head import SegmentHead, proto_channels
from .training_size import with_training_input

__all__ = ["MULTIPLES", "Multiples", "DarkNet", "YoloV8Neck", "YoloV8", "YoloV8Pose", "YoloV8Seg",
           "YoloV8Cls", "YoloV8Spec", "infer_spec", "load_model", "num_anchors"]


class DarkNet(cn.Module):
    """The CSPDarknet backbone: ``(N, H, W, 3)`` → p3 ``(N, H/8, W/8, 256w)``,
    p4 ``(N, H/16, W/16, 512w)``, p5 ``(N, H/32, W/32, 512wr)``."""

    def __init__(self, b1: list[cn.Module], b2: list[cn.Module], b3: list[cn.Module],
                 b4: list[cn.Module], b5: Sppf) -> None:
        super().__init__(b5.device)
        self.b1, self.b2, self.b3, self.b4, self.b5 = b1, b2, b3, b4, b5

    @classmethod
    def load(cls, vb: cn.VarBuilder, m: Multiples, fold_bn: bool = True) -> "DarkNet":
        c, f = m.channels, fold_bn
        c64, c128, c256, c512, c_top = c(64), c(128), c(256), c(512), c(512 * m.ratio)
        net = cls(
            b1=[ConvBlock.load(vb.pp("b1.0"), 3, c64, 3, 2, f),
                ConvBlock.load(vb.pp("b1.1"), c64, c128, 3, 2, f)],
            b2=[C2f.load(vb.pp("b2.0"), c128, c128, m.repeats(3), True, f),
                ConvBlock.load(vb.pp("b2.1"), c128, c256, 3, 2, f),
                C2f.load(vb.pp("b2.2"), c256, c256, m.repeats(6), True, f)],
            b3=[ConvBlock.load(vb.pp("b3.0"), c256, c512, 3, 2, f),
                C2f.load(vb.pp("b3.1"), c512, c512, m.repeats(6), True, f)],
            b4=[ConvBlock.load(vb.pp("b4.0"), c512, c_top, 3, 2, f),
                C2f.load(vb.pp("b4.1"), c_top, c_top, m.repeats(3), True, f)],
            b5=Sppf.load(vb.pp("b5.0"), c_top, c_top, 5, f),
        )
        vb.check_all_read(f"the YOLOv8 backbone (depth {m.depth}, width {m.width})")
        return net

    def forward(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        for block in self.b1 + self.b2:
            x = block(x)
        p3 = x
        for block in self.b3:
            x = block(x)
        p4 = x
        for block in self.b4:
            x = block(x)
        return p3, p4, self.b5(x)


class YoloV8Neck(cn.Module):
    """The PAN neck: top-down (upsample + C2f) then bottom-up (stride-2 conv + C2f) fusion.

    ``(p3, p4, p5)`` → ``(p3', p4', p5')`` of the same sizes, with ``Multiples.filters()``
    channels.
    """

    def __init__(self, n1: C2f, n2: C2f, n3: ConvBlock, n4: C2f, n5: ConvBlock, n6: C2f) -> None:
        super().__init__(n1.device)
        self.n1, self.n2, self.n3, self.n4, self.n5, self.n6 = n1, n2, n3, n4, n5, n6

    @classmethod
    def load(cls, vb: cn.VarBuilder, m: Multiples, fold_bn: bool = True) -> "YoloV8Neck":
        c, f = m.channels, fold_bn
        n = m.repeats(3)
        c256, c512, c_top = c(256), c(512), c(512 * m.ratio)
        neck = cls(
            n1=C2f.load(vb.pp("n1"), c_top + c512, c512, n, False, f),
            n2=C2f.load(vb.pp("n2"), c512 + c256, c256, n, False, f),
            n3=ConvBlock.load(vb.pp("n3"), c256, c256, 3, 2, f),
            n4=C2f.load(vb.pp("n4"), c256 + c512, c512, n, False, f),
            n5=ConvBlock.load(vb.pp("n5"), c512, c512, 3, 2, f),
            n6=C2f.load(vb.pp("n6"), c512 + c_top, c_top, n, False, f),
        )
        vb.check_all_read(f"the YOLOv8 neck (depth {m.depth}, width {m.width})")
        return neck

    def forward(self, p3: mx.array, p4: mx.array,
                p5: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        return pan_forward(p3, p4, p5, top4=self.n1, top3=self.n2, down3=self.n3, fuse4=self.n4,
                           down4=self.n5, fuse5=self.n6)


def num_anchors(height: int, width: int) -> int:
    """Anchors (prediction columns) for an ``height × width`` input."""
    return sum((height // s) * (width // s) for s in STRIDES)


class _YoloV8Base(cn.Module):
    """Backbone ``net``, neck ``fpn`` and a head; shared by detection and pose."""

    def __init__(self, net: DarkNet, fpn: YoloV8Neck, head: cn.Module, spec: "YoloV8Spec") -> None:
        super().__init__(net.device)
        self.net, self.fpn, self.head = net, fpn, head
        self.spec = spec
        self.eval()  # a model predicts as loaded; model.train() to train

    def _check_input(self, x: mx.array) -> None:
        cn.check_image_batch(x, model=type(self).__name__, dtype=cn.model_dtype(self.net),
                          preprocessing="mx.array(letterbox(rgb, 640).as_input())")
        if x.shape[1] % 32 or x.shape[2] % 32 or not x.shape[1] or not x.shape[2]:
            raise cn.ShapeMismatchError(
                f"{type(self).__name__}: input height and width must be positive multiples of 32, "
                f"got {x.shape[1]}×{x.shape[2]} (letterbox the image first)")

    def intermediates(self, x: mx.array) -> dict[str, mx.array]:
        """Every stage's output for ``x`` ``(N, H, W, 3)``: ``backbone_p3/p4/p5`` and
        ``neck_p3/p4/p5`` (NHWC) and ``pred`` (as :meth:`forward`)."""
        self._check_input(x)
        with self.on_device():
            backbone = self.net(x)
            neck = self.fpn(*backbone)
            pred = self._decode(list(neck))
        names = ("p3", "p4", "p5")
        out = {**{f"backbone_{k}": v for k, v in zip(names, backbone)},
               **{f"neck_{k}": v for k, v in zip(names, neck)}}
        if isinstance(pred, tuple):
            pred, out["protos"] = pred
        return {**out, "pred": pred}

    def _decode(self, feats: list[mx.array]) -> Any:
        # The heads work anchor-major; the public layout is ultralytics'/candle's (N, C, A).
        return self.head(feats).transpose(0, 2, 1)

    def forward(self, x: mx.array) -> Any:
        """``eval()``: the decoded prediction (see the subclass). ``train()``: the head's raw
        outputs for a loss (``head.raw``: per level ``(N, H, W, 64 + num_classes)``, NHWC)."""
        self._check_input(x)
        feats = list(self.fpn(*self.net(x)))
        if self.training:
            return self.head.raw(feats)
        return self._decode(feats)


class YoloV8(_YoloV8Base):
    """YOLOv8 detector.

    Call on ``(N, H, W, 3)`` floats in [0, 1] (H, W multiples of 32); returns the raw prediction
    ``(N, 4 + num_classes, A)`` with ``A = num_anchors(H, W)``: box centre x, y, width, height in
    input pixels, then per-class sigmoid scores (ultralytics' eval-mode ``Detect`` output). In
    ``train()`` mode it returns ultralytics' train-mode ``Detect`` output instead, channels-last:
    three arrays ``(N, H/s, W/s, 64 + num_classes)`` for s = 8, 16, 32 (DFL logits, class logits).
    """

    @classmethod
    def load(cls, vb: cn.VarBuilder, variant: str = "n", num_classes: int = 80, *,
             fold_bn: bool = True) -> "YoloV8":
        """Build from ``vb`` (candle names at its root). Raises ShapeMismatchError, naming the
        checkpoint's own variant and class count, when the weights are of another model.
        ``fold_bn=False`` keeps the BatchNorms (eps 1e-3, momentum 0.03) for training; the model
        is returned in eval mode either way."""
        spec = YoloV8Spec(variant, "detect", num_classes)
        _check_weights(vb, spec)
        m = multiples(variant)
        model = cls(DarkNet.load(vb.pp("net"), m, fold_bn),
                    YoloV8Neck.load(vb.pp("fpn"), m, fold_bn),
                    DetectionHead.load(vb.pp("head"), num_classes, m.filters(), fold_bn), spec)
        # a pose or segmentation checkpoint also loads as its detector: its keypoint or mask
        # branches are left unread
        vb.check_all_read(str(spec), unused=("head.cv4.*", "head.proto.*"))
        return model


class YoloV8Pose(_YoloV8Base):
    """YOLOv8 pose estimator: the detector's output plus ``num_keypoints`` keypoints per anchor.

    Returns ``(N, 4 + num_classes + 3 * num_keypoints, A)``: the detector's channels, then per
    keypoint x, y in input pixels and a visibility score. In ``train()`` mode: ``(per-level raw
    maps as YoloV8's, raw keypoints (N, A, 3 * num_keypoints))`` (ultralytics' train-mode ``Pose``).
    """

    @classmethod
    def load(cls, vb: cn.VarBuilder, variant: str = "n", num_keypoints: int = 17,
             num_classes: int = 1, *, fold_bn: bool = True) -> "YoloV8Pose":
        """As :meth:`YoloV8.load` (``fold_bn`` too)."""
        spec = YoloV8Spec(variant, "pose", num_classes, num_keypoints)
        _check_weights(vb, spec)
        m = multiples(variant)
        model = cls(DarkNet.load(vb.pp("net"), m, fold_bn),
                    YoloV8Neck.load(vb.pp("fpn"), m, fold_bn),
                    PoseHead.load(vb.pp("head"), num_classes, num_keypoints, m.filters(), fold_bn),
                    spec)
        vb.check_all_read(str(spec))
        return model


class YoloV8Seg(_YoloV8Base):
    """YOLOv8 instance segmentation: the detector plus mask coefficients and prototypes.

    Returns ``(pred, protos)``: ``pred`` ``(N, 4 + num_classes + num_masks, A)``, the detector's
    channels then each anchor's raw mask coefficients, and ``protos`` ``(N, H/4, W/4, num_masks)``
    (NHWC; ultralytics' ``(N, num_masks, H/4, W/4)`` transposed). Masks come from
    :func:`candle_nn_models.yolo_v8_masks.process_mask`. Train mode is not supported.
    """

    @classmethod
    def load(cls, vb: cn.VarBuilder, variant: str = "n", num_classes: int = 80,
             num_masks: int = 32, *, fold_bn: bool = True) -> "YoloV8Seg":
        """As :meth:`YoloV8.load`."""
        spec = YoloV8Spec(variant, "segment", num_classes, num_masks=num_masks)
        _check_weights(vb, spec)
        m = multiples(variant)
        head = SegmentHead.load(vb.pp("head"), num_classes, m.filters(), num_masks,
                                proto_channels(m.width, m.max_channels()), fold_bn)
        model = cls(DarkNet.load(vb.pp("net"), m, fold_bn),
                    YoloV8Neck.load(vb.pp("fpn"), m, fold_bn), head, spec)
        vb.check_all_read(str(spec))
        return model

    def train(self, mode: bool = True) -> "YoloV8Seg":
        if mode:
            raise NotImplementedError("YoloV8Seg predicts only: training a segmentation model is "
                                      "not supported")
        return super().train(mode)

    def _decode(self, feats: list[mx.array]) -> tuple[mx.array, mx.array]:
        pred, protos = self.head(feats)
        return pred.transpose(0, 2, 1), protos


@dataclass(frozen=True)
class YoloV8Spec:
    """What a YOLOv8 checkpoint holds."""

    variant: str
    task: str  # "detect", "pose", "segment" or "classify"
    num_classes: int
    num_keypoints: int = 0
    num_masks: int = 0

    def __post_init__(self) -> None:
        if self.num_classes < 1 or (self.task == "pose" and self.num_keypoints < 1):
            what = (f"{self.num_classes} classes" if self.num_classes < 1
                    else f"{self.num_keypoints} keypoints")
            raise cn.ShapeMismatchError(f"a YOLOv8 head with {what} is empty: it needs at least 1")

    def __str__(self) -> str:
        classes = f"{self.num_classes} class{'es' if self.num_classes != 1 else ''}"
        if self.task == "pose":
            return f"YOLOv8{self.variant}-pose ({classes}, {self.num_keypoints} keypoints)"
        if self.task == "segment":
            return f"YOLOv8{self.variant}-seg ({classes}, {self.num_masks} masks)"
        if self.task == "classify":
            return f"YOLOv8{self.variant}-cls ({classes})"
        return f"YOLOv8{self.variant} ({classes})"


_STEM = "net.b1.0.conv.weight"


def infer_spec(vb: cn.VarBuilder, name: str = "the checkpoint") -> YoloV8Spec:
    """Variant, task and class/keypoint counts of the checkpoint behind ``vb``, from tensor shapes.

    Raises WeightsFileError (its message starting with ``name``) when ``vb`` does not hold a
    YOLOv8 detection, pose, segmentation or classification checkpoint in candle's layout.
    """
    if not vb.contains(_STEM):
        raise cn.WeightsFileError(
            f"{name} is not a YOLOv8 checkpoint in candle's layout (it has no '{vb.path(_STEM)}')")
    stem = vb.shape(_STEM)[0]
    head = vb.path("net.b2.2.bottleneck.")
    depth = len({n[len(head):].split(".")[0] for n in vb.names() if n.startswith(head)})
    variant = variant_of(stem, depth)
    if variant is None:
        raise cn.WeightsFileError(
            f"{name}: stem width {stem} with {depth} bottlenecks in net.b2.2 matches no YOLOv8 "
            f"size ({', '.join(MULTIPLES)})")
    if vb.contains("head.linear.weight"):
        return YoloV8Spec(variant, "classify", _nonzero(vb, "head.linear.weight", name, "classes"))
    if not vb.contains("head.cv3.0.2.weight"):
        raise cn.WeightsFileError(f"{name} has no YOLOv8 head ('{vb.path('head.cv3.0.2.weight')}' "
                                  "or 'head.linear.weight')")
    num_classes = vb.shape("head.cv3.0.2.weight")[0]
    if num_classes == 0:
        raise cn.WeightsFileError(
            f"{name} has an empty detection head: head.cv3.0.2.weight has 0 output channels "
            "(0 classes)")
    if vb.contains("head.proto.cv1.conv.weight") and vb.contains("head.cv4.0.2.weight"):
        return YoloV8Spec(variant, "segment", num_classes,
                          num_masks=_nonzero(vb, "head.cv4.0.2.weight", name, "mask channels"))
    if not vb.contains("head.cv4.0.2.weight"):
        return YoloV8Spec(variant, "detect", num_classes)
    nk = vb.shape("head.cv4.0.2.weight")[0]
    if nk == 0:
        raise cn.WeightsFileError(
            f"{name} has an empty keypoint head: head.cv4.0.2.weight has 0 output channels")
    if nk % 3:
        raise cn.WeightsFileError(
            f"{name}: pose head with {nk} keypoint channels; only (x, y, visibility) keypoints "
            "(a multiple of 3) are supported")
    return YoloV8Spec(variant, "pose", num_classes, nk // 3)


def _nonzero(vb: cn.VarBuilder, tensor: str, name: str, what: str) -> int:
    count = vb.shape(tensor)[0]
    if count == 0:
        raise cn.WeightsFileError(f"{name} has an empty head: {tensor} has 0 output channels "
                                  f"(0 {what})")
    return count


def _check_weights(vb: cn.VarBuilder, wanted: YoloV8Spec) -> None:
    """Fail early, with both descriptions, when a checkpoint is not the model being built.

    Pose and segmentation checkpoints also load as plain detectors (their detection head is
    complete). Sources without the stem tensor (a fresh VarMap) are not checked.
    """
    if not vb.contains(_STEM):
        return
    found = infer_spec(vb)
    same = (found.variant, found.num_classes) == (wanted.variant, wanted.num_classes)
    if wanted.task != "detect" or found.task == "classify":
        same = same and (found.task, found.num_keypoints, found.num_masks) == (
            wanted.task, wanted.num_keypoints, wanted.num_masks)
    if not same:
        raise cn.ShapeMismatchError(
            f"the weights hold {found}, not {wanted}: build the model the checkpoint holds "
            "(load_model(vb) infers it) or use the weights of the model you want")


def load_model(vb: cn.VarBuilder, spec: YoloV8Spec | None = None, *,
               fold_bn: bool = True) -> YoloV8 | YoloV8Pose | YoloV8Seg | YoloV8Cls:
    """The model ``spec`` describes (default: :func:`infer_spec` of ``vb``), loaded from ``vb``
    (``fold_bn``: as :meth:`YoloV8.load`), with its training input size as ``model.imgsz``
    (:func:`candle_nn_models.training_size.with_training_input`)."""
    spec = infer_spec(vb) if spec is None else spec
    return with_training_input(_load(vb, spec, fold_bn), vb, spec.task)


def _load(vb: cn.VarBuilder, spec: YoloV8Spec,
          fold_bn: bool) -> YoloV8 | YoloV8Pose | YoloV8Seg | YoloV8Cls:
    if spec.task == "classify":
        return YoloV8Cls.load(vb, spec.variant, spec.num_classes, fold_bn=fold_bn)
    if spec.task == "segment":
        return YoloV8Seg.load(vb, spec.variant, spec.num_classes, spec.num_masks,
                              fold_bn=fold_bn)
    if spec.task == "pose":
        return YoloV8Pose.load(vb, spec.variant, spec.num_keypoints, spec.num_classes,
                               fold_bn=fold_bn)
    return YoloV8.load(vb, spec.variant, spec.num_classes, fold_bn=fold_bn)
