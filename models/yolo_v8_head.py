"""YOLOv8's detection head (box regression with DFL + class scores) and pose head, NHWC.

Tensor names (candle's ``yolo-v8/model.rs``): ``cv2.{level}.{0,1,2}`` box branch,
``cv3.{level}.{0,1,2}`` class branch, ``dfl.conv`` the DFL projection, and for pose
``cv4.{level}.{0,1,2}`` the keypoint branch; ``{0,1}`` are :class:`ConvBlock` s, ``2`` a plain
1×1 convolution with bias. YOLO11's heads (``depthwise_cls=True``, ultralytics' non-legacy
``Detect``) make each of the class branch's ``{0,1}`` a depthwise 3×3 then a 1×1 ConvBlock
(``cv3.{level}.{0,1}.{0,1}``).

Both heads return the decoded prediction anchor-major, ``(N, anchors, channels)``, with the anchors
of the stride-8, 16 and 32 maps in that order, each map row-major (ultralytics' order);
:meth:`DetectionHead.raw` / :meth:`PoseHead.raw` the undecoded per-level maps a loss reads
(ultralytics' train-mode ``Detect`` / ``Pose`` outputs).
"""

from __future__ import annotations

import candle_nn as cn
import mlx.core as mx

from .yolo_v8_blocks import ConvBlock
from .yolo_v8_boxes import dist2bbox

REG_MAX = 16  # DFL bins per box side
STRIDES = (8, 16, 32)  # of the three feature maps the heads read (p3, p4, p5)


def _branch(vb: cn.VarBuilder, c_in: int, c_mid: int, c_out: int,
            fold_bn: bool = True) -> cn.Sequential:
    """``0``: 3×3 ConvBlock, ``1``: 3×3 ConvBlock, ``2``: 1×1 conv with bias."""
    return cn.seq([ConvBlock.load(vb.pp(0), c_in, c_mid, 3, fold_bn=fold_bn),
                   ConvBlock.load(vb.pp(1), c_mid, c_mid, 3, fold_bn=fold_bn),
                   cn.Conv2d.load(vb.pp(2), c_mid, c_out, 1, cn.Conv2dConfig())])


def _depthwise_branch(vb: cn.VarBuilder, c_in: int, c_mid: int, c_out: int,
                      fold_bn: bool = True) -> cn.Sequential:
    """YOLO11's class branch: ``0``: depthwise 3×3 + 1×1 ConvBlocks ``c_in → c_mid``, ``1``: the
    same ``c_mid → c_mid``, ``2``: 1×1 conv with bias."""
    def dw_pw(vb: cn.VarBuilder, c1: int, c2: int) -> cn.Sequential:
        return cn.seq([ConvBlock.load(vb.pp(0), c1, c1, 3, fold_bn=fold_bn, groups=c1),
                       ConvBlock.load(vb.pp(1), c1, c2, 1, fold_bn=fold_bn)])

    return cn.seq([dw_pw(vb.pp(0), c_in, c_mid), dw_pw(vb.pp(1), c_mid, c_mid),
                   cn.Conv2d.load(vb.pp(2), c_mid, c_out, 1, cn.Conv2dConfig())])


def make_anchors(sizes: list[tuple[int, int]], strides: tuple[int, ...] = STRIDES,
                 dtype: mx.Dtype = mx.float32) -> tuple[mx.array, mx.array]:
    """Anchor centres ``(A, 2)`` (x, y in feature-map cells, +0.5) and strides ``(A, 1)``.

    ``sizes`` are the ``(H, W)`` of the feature maps; ``A = sum(H * W)``.
    """
    points, stride_rows = [], []
    for (h, w), stride in zip(sizes, strides):
        sx = mx.broadcast_to((mx.arange(w, dtype=mx.float32) + 0.5)[None, :], (h, w))
        sy = mx.broadcast_to((mx.arange(h, dtype=mx.float32) + 0.5)[:, None], (h, w))
        points.append(mx.stack([sx, sy], axis=-1).reshape(h * w, 2))
        stride_rows.append(mx.full((h * w, 1), float(stride), dtype=mx.float32))
    return (mx.concatenate(points, axis=0).astype(dtype),
            mx.concatenate(stride_rows, axis=0).astype(dtype))


class Dfl(cn.Module):
    """Distribution focal loss decoding: the expectation of a softmax over ``REG_MAX`` bins.

    ``conv`` is a 1×1 convolution ``REG_MAX → 1`` (weights ``0..REG_MAX-1`` in trained models).
    Input ``(N, A, 4 * REG_MAX)`` (side-major: left, top, right, bottom) → ``(N, A, 4)``.
    """

    def __init__(self, conv: cn.Conv2d, bins: int = REG_MAX) -> None:
        super().__init__(conv.device)
        self.conv = conv
        self.bins = bins

    @classmethod
    def load(cls, vb: cn.VarBuilder, bins: int = REG_MAX) -> "Dfl":
        return cls(cn.Conv2d.load(vb.pp("conv"), bins, 1, 1, cn.Conv2dConfig(), bias=False), bins)

    def forward(self, x: mx.array) -> mx.array:
        n, a, _ = x.shape
        return cn.ops.dfl_decode(x.reshape(n, a, 4, self.bins), self.conv.weight)


class DetectionHead(cn.Module):
    """Boxes and class scores from the neck's three maps.

    Output ``(N, A, 4 + num_classes)``: box centre x, y, width, height in input pixels, then the
    per-class sigmoid scores.
    """

    def __init__(self, dfl: Dfl, cv2: list[cn.Sequential], cv3: list[cn.Sequential],
                 num_classes: int) -> None:
        super().__init__(dfl.device)
        self.dfl, self.cv2, self.cv3 = dfl, cv2, cv3
        self.num_classes = num_classes

    @classmethod
    def load(cls, vb: cn.VarBuilder, num_classes: int, filters: tuple[int, int, int],
             fold_bn: bool = True, *, depthwise_cls: bool = False) -> "DetectionHead":
        """``filters``: channels of the neck's p3, p4, p5 outputs; ``depthwise_cls``: YOLO11's
        class branch (depthwise + pointwise ConvBlocks)."""
        c2 = max(16, filters[0] // 4, 4 * REG_MAX)
        # ultralytics caps the class branch width at 100 (candle's max(filters[0], nc) agrees
        # for every class count up to 100, which covers its published checkpoints).
        c3 = max(filters[0], min(num_classes, 100))
        cv2 = [_branch(vb.pp(f"cv2.{i}"), f, c2, 4 * REG_MAX, fold_bn)
               for i, f in enumerate(filters)]
        cls_branch = _depthwise_branch if depthwise_cls else _branch
        cv3 = [cls_branch(vb.pp(f"cv3.{i}"), f, c3, num_classes, fold_bn)
               for i, f in enumerate(filters)]
        head = cls(Dfl.load(vb.pp("dfl")), cv2, cv3, num_classes)
        # a pose or segmentation head's detection part loads as a detection head: its cv4 (and
        # proto) are left unread
        family = "YOLO11" if depthwise_cls else "YOLOv8"
        vb.check_all_read(f"a {family} detection head ({num_classes} classes)",
                          unused=("cv4.*", "proto.*"))
        return head

    def raw(self, feats: list[mx.array]) -> list[mx.array]:
        """Per level, the box branch's DFL logits and the class logits side by side:
        ``(N, H, W, 4 * REG_MAX + num_classes)`` for each NHWC map of ``feats`` (ultralytics'
        train-mode ``Detect`` output, channels-last)."""
        return [cn.ops.concat_last([box(f), cls(f)])
                for f, box, cls in zip(feats, self.cv2, self.cv3)]

    def forward_with_anchors(self, feats: list[mx.array]) -> tuple[mx.array, mx.array, mx.array]:
        """``(prediction (N, A, 4 + nc), anchors (A, 2), strides (A, 1))`` for NHWC ``feats``."""
        n = feats[0].shape[0]
        box = mx.concatenate([cv(f).reshape(n, -1, 4 * REG_MAX)
                              for f, cv in zip(feats, self.cv2)], axis=1)
        cls = mx.concatenate([cv(f).reshape(n, -1, self.num_classes)
                              for f, cv in zip(feats, self.cv3)], axis=1)
        anchors, strides = make_anchors([tuple(f.shape[1:3]) for f in feats], STRIDES, box.dtype)
        xywh = dist2bbox(self.dfl(box), anchors) * strides
        return cn.ops.concat_last([xywh, cn.sigmoid(cls)]), anchors, strides

    def forward(self, feats: list[mx.array]) -> mx.array:
        return self.forward_with_anchors(feats)[0]


class PoseHead(cn.Module):
    """The detection head plus ``num_keypoints`` keypoints per anchor.

    Output ``(N, A, 4 + num_classes + 3 * num_keypoints)``: the detection head's channels, then per
    keypoint x, y (input pixels) and visibility (sigmoid).
    """

    def __init__(self, detect: DetectionHead, cv4: list[cn.Sequential], num_keypoints: int) -> None:
        super().__init__(detect.device)
        self.detect, self.cv4 = detect, cv4
        self.num_keypoints = num_keypoints

    @classmethod
    def load(cls, vb: cn.VarBuilder, num_classes: int, num_keypoints: int,
             filters: tuple[int, int, int], fold_bn: bool = True, *,
             depthwise_cls: bool = False) -> "PoseHead":
        """As :meth:`DetectionHead.load`; the keypoint branch is YOLOv8's in both versions."""
        nk = 3 * num_keypoints
        c4 = max(filters[0] // 4, nk)
        cv4 = [_branch(vb.pp(f"cv4.{i}"), f, c4, nk, fold_bn) for i, f in enumerate(filters)]
        head = cls(DetectionHead.load(vb, num_classes, filters, fold_bn,
                                      depthwise_cls=depthwise_cls), cv4, num_keypoints)
        family = "YOLO11" if depthwise_cls else "YOLOv8"
        vb.check_all_read(f"a {family} pose head ({num_keypoints} keypoints)")
        return head

    def raw(self, feats: list[mx.array]) -> tuple[list[mx.array], mx.array]:
        """The detection head's :meth:`DetectionHead.raw` maps and the raw keypoint outputs
        ``(N, anchors, 3 * num_keypoints)`` (ultralytics' train-mode ``Pose`` output, anchor-major;
        decoding is ``forward``'s)."""
        n = feats[0].shape[0]
        kpt = mx.concatenate([cv(f).reshape(n, -1, 3 * self.num_keypoints)
                              for f, cv in zip(feats, self.cv4)], axis=1)
        return self.detect.raw(feats), kpt

    def forward(self, feats: list[mx.array]) -> mx.array:
        det, anchors, strides = self.detect.forward_with_anchors(feats)
        n, k = feats[0].shape[0], self.num_keypoints
        kpt = mx.concatenate([cv(f).reshape(n, -1, 3 * k) for f, cv in zip(feats, self.cv4)], 1)
        kpt = kpt.reshape(n, -1, k, 3)
        # ultralytics' order of operations: (v * 2 + (anchor - 0.5)) * stride
        xy = (kpt[..., :2] * 2.0 + (anchors[:, None, :] - 0.5)) * strides[:, None, :]
        kpt = mx.concatenate([xy, cn.sigmoid(kpt[..., 2:])], axis=-1).reshape(n, -1, 3 * k)
        return mx.concatenate([det, kpt], axis=-1)
