"""ResNet-18/34/50/101/152 (He et al. 2015; torchvision's v1.5 layout), loaded with candle's names.

Tensor names, as candle-transformers' ``resnet.rs`` and torchvision write them::

    conv1, bn1                                     7x7/2 stem conv + BatchNorm
    layer{1..4}.{i}.conv1|bn1|conv2|bn2            basic blocks (18, 34)
    layer{1..4}.{i}.conv1|bn1|conv2|bn2|conv3|bn3  bottlenecks (50, 101, 152); stride on conv2
    layer{2..4}.0.downsample.0|1                   1x1 projection conv + BatchNorm
    fc                                             classifier (absent when headless)

Every BatchNorm (eps 1e-5, momentum 0.1) is folded into its convolution at load, unless the model
is built for training (``fold_bn=False``: see docs/training.md). Inputs are NHWC float batches
``(N, H, W, 3)`` normalised with ImageNet's mean/std (see :mod:`candle_nn_models.imagenet`); outputs
are logits ``(N, num_classes)``, or pooled features ``(N, 512 | 2048)`` for a headless model.
"""

from __future__ import annotations

from dataclasses import dataclass

from candle_nn import (Conv2d, Conv2dConfig, ConvBn, Linear, Module, ShapeMismatchError,
                       VarBuilder, WeightsFileError, check_image_batch, max_pool2d, sigmoid,
                       softmax)
import mlx.core as mx

from .training_size import CLASSIFY_SIZE, training_size


@dataclass(frozen=True)
class ResNetConfig:
    """A depth: block type and number of blocks in each of the four stages."""

    bottleneck: bool
    blocks: tuple[int, int, int, int]

    @property
    def expansion(self) -> int:
        return 4 if self.bottleneck else 1

    @property
    def feature_dim(self) -> int:
        return 512 * self.expansion


VARIANTS: dict[str, ResNetConfig] = {
    "resnet18": ResNetConfig(False, (2, 2, 2, 2)),
    "resnet34": ResNetConfig(False, (3, 4, 6, 3)),
    "resnet50": ResNetConfig(True, (3, 4, 6, 3)),
    "resnet101": ResNetConfig(True, (3, 4, 23, 3)),
    "resnet152": ResNetConfig(True, (3, 8, 36, 3)),
}
STAGE_WIDTHS = (64, 128, 256, 512)


def conv_bn(vb: VarBuilder, conv: str, bn: str, in_channels: int, out_channels: int,
            kernel_size: int, stride: int = 1, fold_bn: bool = True) -> "Conv2d | ConvBn":
    """``vb.conv`` (no bias, "same" padding) with ``vb.bn`` absorbed (``fold_bn=False``: kept)."""
    config = Conv2dConfig(padding=kernel_size // 2, stride=stride)
    return ConvBn.load(vb, in_channels, out_channels, kernel_size, config, conv=conv, bn=bn,
                    eps=1e-5, momentum=0.1, fold_bn=fold_bn)


class ResidualBlock(Module):
    """A residual block: ``relu(body(x) + shortcut(x))``, the body being convs with ReLUs between.

    Basic blocks have two 3x3 convs; bottlenecks 1x1 → 3x3 (strided) → 1x1 with 4x expansion.
    The shortcut is the identity or the ``downsample`` projection.
    """

    def __init__(self, convs: "list[Conv2d | ConvBn]",
                 downsample: "Conv2d | ConvBn | None") -> None:
        super().__init__(convs[0].device)
        self.convs = convs
        if downsample is not None:
            self.downsample = downsample

    @classmethod
    def load(cls, vb: VarBuilder, config: ResNetConfig, in_channels: int, width: int,
             stride: int, fold_bn: bool = True) -> "ResidualBlock":
        out_channels = width * config.expansion
        f = fold_bn
        if config.bottleneck:
            convs = [conv_bn(vb, "conv1", "bn1", in_channels, width, 1, fold_bn=f),
                     conv_bn(vb, "conv2", "bn2", width, width, 3, stride, fold_bn=f),
                     conv_bn(vb, "conv3", "bn3", width, out_channels, 1, fold_bn=f)]
        else:
            convs = [conv_bn(vb, "conv1", "bn1", in_channels, width, 3, stride, fold_bn=f),
                     conv_bn(vb, "conv2", "bn2", width, width, 3, fold_bn=f)]
        downsample = None
        if stride != 1 or in_channels != out_channels:
            downsample = conv_bn(vb.pp("downsample"), "0", "1", in_channels, out_channels, 1,
                                 stride, fold_bn=f)
        return cls(convs, downsample)

    def forward(self, x: mx.array) -> mx.array:
        shortcut = self.downsample(x) if "downsample" in self else x
        y = x
        for conv in self.convs[:-1]:
            y = conv(y, activation="relu")
        return self.convs[-1](y, activation="relu", residual=shortcut)


class ResNet(Module):
    """A ResNet classifier (or, with ``fc=None``, a pooled-feature extractor).

    Call it on ``(N, H, W, 3)`` normalised NHWC floats to get logits ``(N, num_classes)`` (headless:
    features ``(N, feature_dim)``). :meth:`forward_features` also returns the intermediate maps.
    """

    def __init__(self, variant: str, stem: "Conv2d | ConvBn", stages: list[list[ResidualBlock]],
                 fc: Linear | None) -> None:
        super().__init__(stem.device)
        self.variant = variant
        self.config = VARIANTS[variant]
        self.stem = stem
        self.stages = stages
        if fc is not None:
            self.fc = fc
        self.eval()  # a model predicts as loaded; model.train() to train

    @classmethod
    def load(cls, vb: VarBuilder, variant: str = "resnet18",
             num_classes: int | None = 1000, *, fold_bn: bool = True) -> "ResNet":
        """Build ``variant`` from ``vb``; ``num_classes=None`` builds it headless (no ``fc``).

        ``fold_bn=False`` keeps every BatchNorm as a layer (:class:`candle_nn.ConvBn`), to train:
        ``model.train()`` then uses batch statistics and updates the running ones. The model is
        returned in eval mode either way. ``model.imgsz``: the crop it was trained at (a
        fine-tuned file's ``candle_nn.imgsz``, else 224), evaluated as
        ``imagenet.preprocess(rgb, eval_resize(model.imgsz), model.imgsz)``."""
        if variant not in VARIANTS:
            raise ValueError(f"unknown ResNet variant {variant!r}; choose one of {list(VARIANTS)}")
        if num_classes is not None and num_classes < 1:
            raise ShapeMismatchError(
                f"a ResNet head needs at least 1 class, not {num_classes}: pass num_classes=None "
                "for a headless backbone")
        config = VARIANTS[variant]
        stem = conv_bn(vb, "conv1", "bn1", 3, 64, 7, stride=2, fold_bn=fold_bn)
        stages, channels = [], 64
        for index, (width, count) in enumerate(zip(STAGE_WIDTHS, config.blocks)):
            layer = vb.pp(f"layer{index + 1}")
            blocks = []
            for i in range(count):
                stride = 2 if i == 0 and index > 0 else 1
                blocks.append(ResidualBlock.load(layer.pp(i), config, channels, width, stride,
                                                 fold_bn))
                channels = width * config.expansion
            stages.append(blocks)
        fc = None if num_classes is None else Linear.load(vb.pp("fc"), channels, num_classes)
        # A headless backbone may come from a classifier's file: its fc is left unread.
        vb.check_all_read(variant, unused=("fc.*",) if num_classes is None else (),
                          hint=lambda: _what_it_holds(vb))
        model = cls(variant, stem, stages, fc)
        model.imgsz = training_size(vb.metadata, "the weights") or CLASSIFY_SIZE
        return model

    @property
    def num_classes(self) -> int | None:
        """Classifier size, or ``None`` for a headless model."""
        return self.fc.out_features if "fc" in self else None

    def forward_features(self, x: mx.array) -> dict[str, mx.array]:
        """Intermediate outputs: ``stem`` (after the max-pool), ``layer1``..``layer4`` (NHWC) and
        ``pooled`` ``(N, feature_dim)``."""
        check_image_batch(x, model="ResNet", dtype=self.stem.weight.dtype,
                          preprocessing="candle_nn_models.imagenet.preprocess_batch(images)")
        with self.on_device():
            out = {"stem": max_pool2d(self.stem(x, activation="relu"), 3, 2, 1)}
            y = out["stem"]
            for index, blocks in enumerate(self.stages):
                for block in blocks:
                    y = block(y)
                out[f"layer{index + 1}"] = y
            out["pooled"] = y.mean(axis=(1, 2))
        return out

    def forward(self, x: mx.array) -> mx.array:
        pooled = self.forward_features(x)["pooled"]
        return self.fc(pooled) if "fc" in self else pooled


def class_probabilities(logits: mx.array) -> mx.array:
    """Class probabilities ``(N, num_classes)`` of a classifier's logits ``(N, num_classes)``.

    A softmax over the classes, as torchvision and timm read a multi-class head. A head of one
    logit is a binary classifier trained with a sigmoid (``BCEWithLogitsLoss``): a softmax over
    one logit would give 100 % for every image, so its probability is ``sigmoid(logit)``, the
    chance of that class.
    """
    if logits.shape[-1] == 1:
        return sigmoid(logits)
    return softmax(logits, axis=-1)


def _what_it_holds(vb: VarBuilder) -> str:
    try:
        variant, num_classes = infer_variant(vb)
    except WeightsFileError:
        return ""
    head = "headless" if num_classes is None else f"{num_classes} classes"
    return f"The file holds {variant} ({head}): ResNet.load(vb, {variant!r}) builds it."


def infer_variant(vb: VarBuilder, name: str = "the weights") -> tuple[str, int | None]:
    """``(variant, num_classes)`` of the ResNet whose tensors ``vb`` holds (``None``: headless).

    Read from the tensor names (bottleneck ``conv3`` or not, blocks per stage) and the ``fc``
    shape. Raises WeightsFileError (naming ``name``) when the tensors are no candle ResNet.
    """
    if not (vb.contains("conv1.weight") and vb.contains("layer1.0.conv1.weight")):
        raise WeightsFileError(
            f"{name} holds no ResNet (no conv1.weight / layer1.0.conv1.weight); "
            "pass a ResNet checkpoint in candle's layout")
    counts: list[int] = []
    for stage in range(1, 5):
        n = 0
        while vb.contains(f"layer{stage}.{n}.conv1.weight"):
            n += 1
        counts.append(n)
    blocks = (counts[0], counts[1], counts[2], counts[3])
    found = ResNetConfig(vb.contains("layer1.0.conv3.weight"), blocks)
    for variant, config in VARIANTS.items():
        if config == found:
            num_classes = vb.shape("fc.weight")[0] if vb.contains("fc.weight") else None
            if num_classes == 0:
                raise WeightsFileError(
                    f"{name} has an empty classifier head: fc.weight is "
                    f"{tuple(vb.shape('fc.weight'))}, 0 classes")
            return variant, num_classes
    kind = "bottleneck" if found.bottleneck else "basic"
    raise WeightsFileError(f"{name} holds a ResNet with {kind} blocks {blocks} per "
                           "stage, which is none of resnet18/34/50/101/152")

