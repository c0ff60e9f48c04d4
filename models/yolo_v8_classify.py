"""YOLOv8-cls image classification (sizes n/s/m/l/x), NHWC: ultralytics' ``yolov8-cls.yaml``.

The backbone is YOLOv8's CSPDarknet up to its stride-32 C2f (no SPPF), with the stride-32 stage
at 1024 × width channels for every size; the head is ultralytics' ``Classify``: a 1×1
:class:`ConvBlock` to 1280 channels, global average pooling, dropout (identity in eval) and a
Linear; softmax in eval mode.

Tensor names: the backbone's follow candle's YOLOv8 (``net.b1.0`` … ``net.b4.1``, a C2f's
``bottleneck.K``); the head, which candle does not have, follows ultralytics' module names under
``head``: ``head.conv`` (ConvBlock), ``head.linear``.

Preprocessing (:func:`preprocess`) is ultralytics' ``classify_transforms``: shorter side resized
to 224 (bilinear, antialiased, as torchvision on a PIL image), centre crop 224, ``/255``, no
mean/std.
"""

from __future__ import annotations

import candle_nn as cn
import mlx.core as mx
import numpy as np

from .imagenet import preprocess as _imagenet_preprocess
from .training_size import CLASSIFY_SIZE, ClassifyPreprocess
from .yolo_v8_blocks import C2f, ConvBlock
from .yolo_v8_multiples import Multiples, multiples, variant_of

__all__ = ["CLASSIFY_CHANNELS", "IMAGE_SIZE", "ClassifyBackbone", "ClassifyHead", "YoloV8Cls",
           "preprocess"]

CLASSIFY_CHANNELS = 1280  # ultralytics' Classify: "efficientnet_b0 size"
IMAGE_SIZE = CLASSIFY_SIZE
_STEM = "net.b1.0.conv.weight"
_LINEAR = "head.linear.weight"


def preprocess(rgb: np.ndarray, size: int = IMAGE_SIZE,
               recorded: ClassifyPreprocess | None = None) -> np.ndarray:
    """uint8 ``(H, W, 3)`` RGB → float32 ``(size, size, 3)``, as ultralytics' classify predictor:
    the transform the checkpoint's trainer stored (``recorded``: ``model.preprocessing``) when
    it crops to ``size``, else ``classify_transforms(size)`` (torchvision ``Resize(size)``,
    ``CenterCrop(size)``, ``ToTensor``, ``Normalize(0, 1)``: values in [0, 1]); channels-last."""
    if recorded is None or recorded.crop != size:
        recorded = ClassifyPreprocess(size, size)
    mean, std = recorded.arrays()
    return _imagenet_preprocess(rgb, resize=recorded.resize, crop=recorded.crop, mean=mean,
                                std=std)


class ClassifyBackbone(cn.Module):
    """CSPDarknet without SPPF: ``(N, H, W, 3)`` → ``(N, H/32, W/32, 1024 × width)``."""

    def __init__(self, blocks: list[cn.Module]) -> None:
        super().__init__(blocks[0].device)
        self.blocks = blocks

    @classmethod
    def load(cls, vb: cn.VarBuilder, m: Multiples, fold_bn: bool = True) -> "ClassifyBackbone":
        c, f, r = m.channels, fold_bn, m.repeats
        names = ("b1.0", "b1.1", "b2.0", "b2.1", "b2.2", "b3.0", "b3.1", "b4.0", "b4.1")
        widths = (c(64), c(128), c(128), c(256), c(256), c(512), c(512), c(1024), c(1024))
        depths = (0, 0, r(3), 0, r(6), 0, r(6), 0, r(3))
        blocks, c_in = [], 3
        for name, width, depth in zip(names, widths, depths):
            if depth:
                blocks.append(C2f.load(vb.pp(name), c_in, width, depth, True, f))
            else:
                blocks.append(ConvBlock.load(vb.pp(name), c_in, width, 3, 2, f))
            c_in = width
        return cls(blocks)

    def forward(self, x: mx.array) -> mx.array:
        for block in self.blocks:
            x = block(x)
        return x


class ClassifyHead(cn.Module):
    """ultralytics' ``Classify``: ``(N, H, W, c1)`` → logits ``(N, num_classes)`` (1×1 ConvBlock
    to 1280, global average pool, dropout (p = 0 in eval), Linear)."""

    def __init__(self, conv: ConvBlock, linear: cn.Linear) -> None:
        super().__init__(conv.device)
        self.conv, self.linear = conv, linear

    @classmethod
    def load(cls, vb: cn.VarBuilder, c1: int, num_classes: int,
             fold_bn: bool = True) -> "ClassifyHead":
        return cls(ConvBlock.load(vb.pp("conv"), c1, CLASSIFY_CHANNELS, 1, fold_bn=fold_bn),
                   cn.Linear.load(vb.pp("linear"), CLASSIFY_CHANNELS, num_classes))

    def forward(self, x: mx.array) -> mx.array:
        return self.linear(mx.mean(self.conv(x), axis=(1, 2)))


class YoloV8Cls(cn.Module):
    """YOLOv8 classifier.

    Call on ``(N, H, W, 3)`` floats in [0, 1] (:func:`preprocess`; 224 × 224 as trained, any size
    a multiple of 32 works); returns class probabilities ``(N, num_classes)`` (softmax), or the
    logits in ``train()`` mode (ultralytics' ``Classify``).
    """

    def __init__(self, net: ClassifyBackbone, head: ClassifyHead, variant: str,
                 num_classes: int) -> None:
        super().__init__(net.device)
        self.net, self.head = net, head
        self.variant, self.num_classes = variant, num_classes
        self.eval()

    @classmethod
    def load(cls, vb: cn.VarBuilder, variant: str = "n", num_classes: int = 1000, *,
             fold_bn: bool = True) -> "YoloV8Cls":
        """Build from ``vb``. Raises ShapeMismatchError, naming what the checkpoint holds, when the
        weights are of another size or class count."""
        _check_weights(vb, variant, num_classes)
        m = multiples(variant)
        net = ClassifyBackbone.load(vb.pp("net"), m, fold_bn)
        model = cls(net, ClassifyHead.load(vb.pp("head"), m.channels(1024), num_classes, fold_bn),
                    variant, num_classes)
        vb.check_all_read(f"YOLOv8{variant}-cls ({num_classes} classes)")
        return model

    def forward(self, x: mx.array) -> mx.array:
        cn.check_image_batch(x, model="YoloV8Cls", dtype=cn.model_dtype(self.net),
                             preprocessing="mx.array(preprocess(rgb)[None])")
        if x.shape[1] < 32 or x.shape[2] < 32:
            raise cn.ShapeMismatchError(
                f"YoloV8Cls: input {x.shape[1]}×{x.shape[2]} is below 32×32 (use preprocess(rgb))")
        logits = self.head(self.net(x))
        return logits if self.training else cn.softmax(logits, axis=-1)


def _check_weights(vb: cn.VarBuilder, variant: str, num_classes: int) -> None:
    """ShapeMismatchError when the checkpoint behind ``vb`` holds another classifier (sources
    without the stem tensor, a fresh VarMap, are not checked)."""
    if not vb.contains(_STEM):
        return
    if not vb.contains(_LINEAR):
        raise cn.ShapeMismatchError(
            f"the weights hold no classification head ({vb.path(_LINEAR)}): not a YOLOv8-cls "
            "checkpoint")
    head = vb.path("net.b2.2.bottleneck.")
    depth = len({n[len(head):].split(".")[0] for n in vb.names() if n.startswith(head)})
    found = variant_of(vb.shape(_STEM)[0], depth) or "?"
    classes = vb.shape(_LINEAR)[0]
    if (found, classes) != (variant, num_classes):
        raise cn.ShapeMismatchError(
            f"the weights hold YOLOv8{found}-cls ({classes} classes), not YOLOv8{variant}-cls "
            f"({num_classes} classes): build the model the checkpoint holds")
