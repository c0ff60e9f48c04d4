"""YOLOv8's instance-segmentation head (ultralytics ``Segment``): the detection head plus, per
anchor, ``num_masks`` mask coefficients, and :class:`Proto`, the mask prototypes. NHWC.

Tensor names: candle has no segmentation model, so they follow ultralytics' module names under
the head: ``cv2.*``, ``cv3.*``, ``dfl.conv`` as the detection head, ``cv4.{level}.{0,1,2}`` the
mask-coefficient branch (two 3×3 :class:`ConvBlock` s and a 1×1 convolution with bias), and
``proto.cv1`` (3×3 ConvBlock), ``proto.upsample`` (2×2 stride-2 transposed convolution with
bias), ``proto.cv2`` (3×3 ConvBlock), ``proto.cv3`` (1×1 ConvBlock).

The mask post-processing (coefficients × prototypes, crop, upsample, threshold) is
:mod:`candle_nn_models.yolo_v8_masks`.
"""

from __future__ import annotations

import candle_nn as cn
import mlx.core as mx

from .yolo_v8_blocks import ConvBlock
from .yolo_v8_head import DetectionHead, _branch

NUM_MASKS = 32  # ultralytics' yolov8-seg.yaml: Segment [nc, 32, 256]
PROTO_CHANNELS = 256  # before width scaling


def proto_channels(width: float, max_channels: int) -> int:
    """The prototype branch's hidden width at a model size: ultralytics' ``make_divisible(
    min(256, max_channels) * width, 8)`` (64 for n, 128 s, 192 m, 256 l, 320 x)."""
    return -(-int(min(PROTO_CHANNELS, max_channels) * width) // 8) * 8


class Proto(cn.Module):
    """Mask prototypes from the stride-8 map: ``cv1`` → 2× ``upsample`` (transposed conv) →
    ``cv2`` → ``cv3``.

    Input ``(N, H, W, c1)`` → ``(N, 2H, 2W, num_masks)`` (stride 4 of the model input).
    """

    def __init__(self, cv1: ConvBlock, upsample: cn.ConvTranspose2d, cv2: ConvBlock,
                 cv3: ConvBlock) -> None:
        super().__init__(cv1.device)
        self.cv1, self.upsample, self.cv2, self.cv3 = cv1, upsample, cv2, cv3

    @classmethod
    def load(cls, vb: cn.VarBuilder, c1: int, hidden: int = PROTO_CHANNELS,
             num_masks: int = NUM_MASKS, fold_bn: bool = True) -> "Proto":
        config = cn.ConvTranspose2dConfig(stride=2)
        return cls(ConvBlock.load(vb.pp("cv1"), c1, hidden, 3, fold_bn=fold_bn),
                   cn.ConvTranspose2d.load(vb.pp("upsample"), hidden, hidden, 2, config),
                   ConvBlock.load(vb.pp("cv2"), hidden, hidden, 3, fold_bn=fold_bn),
                   ConvBlock.load(vb.pp("cv3"), hidden, num_masks, 1, fold_bn=fold_bn))

    def forward(self, x: mx.array) -> mx.array:
        return self.cv3(self.cv2(self.upsample(self.cv1(x))))


class SegmentHead(cn.Module):
    """A detection head plus ``num_masks`` mask coefficients per anchor and the prototypes.

    ``forward(feats)`` → ``(pred (N, A, 4 + num_classes + num_masks), protos (N, H/4, W/4,
    num_masks))``: the detection head's channels, then the raw (linear) mask coefficients;
    prototypes NHWC at stride 4. ``detect`` is any head with YOLOv8's ``forward`` layout (YOLO11's
    head fits too).
    """

    def __init__(self, detect: cn.Module, cv4: list[cn.Sequential], proto: Proto,
                 num_masks: int) -> None:
        super().__init__(proto.device)
        self.detect, self.cv4, self.proto = detect, cv4, proto
        self.num_masks = num_masks

    @classmethod
    def load(cls, vb: cn.VarBuilder, num_classes: int, filters: tuple[int, int, int],
             num_masks: int = NUM_MASKS, proto_hidden: int = PROTO_CHANNELS,
             fold_bn: bool = True, detect: cn.Module | None = None) -> "SegmentHead":
        """``filters``: channels of the neck's p3, p4, p5 outputs. ``detect``: the detection part,
        built by the caller (default: YOLOv8's :class:`DetectionHead` from ``vb``)."""
        if detect is None:
            detect = DetectionHead.load(vb, num_classes, filters, fold_bn)
        c4 = max(filters[0] // 4, num_masks)
        cv4 = [_branch(vb.pp(f"cv4.{i}"), f, c4, num_masks, fold_bn)
               for i, f in enumerate(filters)]
        proto = Proto.load(vb.pp("proto"), filters[0], proto_hidden, num_masks, fold_bn)
        head = cls(detect, cv4, proto, num_masks)
        vb.check_all_read(f"a YOLOv8 segmentation head ({num_classes} classes, {num_masks} masks)")
        return head

    def raw(self, feats: list[mx.array]) -> list[mx.array]:
        raise NotImplementedError("the YOLOv8 segmentation head predicts only: its train-mode "
                                  "outputs (and a segmentation loss) are not implemented")

    def forward(self, feats: list[mx.array]) -> tuple[mx.array, mx.array]:
        n = feats[0].shape[0]
        coefficients = mx.concatenate([cv(f).reshape(n, -1, self.num_masks)
                                       for f, cv in zip(feats, self.cv4)], axis=1)
        pred = mx.concatenate([self.detect(feats), coefficients], axis=-1)
        return pred, self.proto(feats[0])
