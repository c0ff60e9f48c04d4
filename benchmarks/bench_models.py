"""What ``candle-nn-bench`` measures: each model, built three ways (ours, PyTorch, ONNX export).

A :class:`BenchModel` names one model at one input size and knows how to build

* **ours** from a :class:`~candle_nn.VarBuilder` (``build_ours(vb) -> forward``, NHWC input), with
  the same weights the reference fixtures use when ``fixture`` is set, else seeded VarMap weights;
* **the PyTorch reference** (``build_torch() -> nn.Module``, NCHW input), randomly initialised:
  speed does not depend on the values; ``None`` when the reference code is not installed, with
  ``torch_missing`` saying what to install;
* its ONNX export, made from the PyTorch module (see benchmarks/bench_peers.py).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # candle_nn is imported only where ours runs (peers run without it)
    import mlx.core as mx

    from candle_nn import VarBuilder

Forward = Callable[..., Any]


@dataclass(frozen=True)
class BenchModel:
    """One benchmarked model.

    Attributes:
        name: ``resnet18``, ``yolov8n``, ``yolo11n``, ``mobilesam-encoder``, ...
        input_hw: image height, width (inputs are ``(N, H, W, 3)`` NHWC for ours, NCHW for peers).
        batch: the batch for the throughput figure on the CPU (GPUs use ``--batch``, default 32).
        fixture: folder name under the shared fixtures holding candle-named weights, or ``None``.
        make_inputs: ``(n, rng) -> numpy inputs`` for a batch of ``n``, shared by every
            implementation; the first is NHWC (transposed to NCHW for the peers). Default: one
            ``(n, H, W, 3)`` float32 image batch in [0, 1).
        pipeline: a whole pipeline rather than one forward (benchmarks/bench_amg.py runs it:
            ``build_ours`` gives the model it wraps; ``build_torch`` is unused); one image per
            call, ours and PyTorch eager only.
        train: a training step rather than a forward (benchmarks/bench_train.py runs it):
            ``"classify"`` (cross-entropy) or ``"detect"`` (YOLOv8's ``DetectionLoss``);
            ``build_ours`` builds the model for training (``fold_bn=False``), ``batch`` is the
            step's batch on every device.
    """

    name: str
    input_hw: tuple[int, int]
    batch: int
    fixture: str | None
    build_ours: Callable[["VarBuilder"], Forward]
    build_torch: Callable[[], Any]
    torch_missing: str | None = None
    make_inputs: Callable[[int, Any], tuple] | None = None
    pipeline: bool = False
    train: str | None = None

    def inputs(self, n: int, seed: int = 0) -> tuple:
        """Seeded numpy inputs for a batch of ``n`` (see ``make_inputs``)."""
        import numpy as np

        rng = np.random.default_rng(seed)
        if self.make_inputs is not None:
            return self.make_inputs(n, rng)
        return (rng.random((n, *self.input_hw, 3), dtype=np.float32),)


def _have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ModuleNotFoundError, ValueError):
        return False


def _ours(model: str, variant: str, **counts: int) -> Callable[["VarBuilder"], Any]:
    """Our ``model``/``variant`` (names of ``candle_nn_models.weights.SPECS``), built the way
    every tool builds it: ``weights.build_model``."""
    def build(vb: "VarBuilder") -> Any:
        from candle_nn_models.weights.spec import build_model

        return build_model(model, variant, vb, **counts)
    return build


# -- ResNet ----------------------------------------------------------------------------------------
def _resnet_ours(variant: str) -> Callable[["VarBuilder"], Forward]:
    return _ours("resnet", variant, num_classes=1000)


def _resnet_torch(variant: str) -> Callable[[], Any]:
    def build() -> Any:
        import torchvision

        return getattr(torchvision.models, variant)(weights=None)
    return build


def _resnet_train_ours(variant: str) -> Callable[["VarBuilder"], Forward]:
    def build(vb: "VarBuilder") -> Forward:
        from candle_nn_models.resnet import ResNet

        return ResNet.load(vb, variant, num_classes=1000, fold_bn=False)
    return build


# -- YOLOv8 ----------------------------------------------------------------------------------------
def _yolo_ours(size: str) -> Callable[["VarBuilder"], Forward]:
    return _ours("yolo_v8", size, num_classes=80)


def _resnet_train_torch(variant: str) -> Callable[[], Any]:
    """torchvision's ResNet, or where torchvision cannot be imported the same network from
    benchmarks/resnet_reference.py."""
    def build() -> Any:
        try:
            import torchvision
        except (ImportError, RuntimeError):
            from benchmarks.resnet_reference import resnet

            return resnet(variant)
        return getattr(torchvision.models, variant)(weights=None)
    return build


def _yolo_train_ours(size: str) -> Callable[["VarBuilder"], Forward]:
    def build(vb: "VarBuilder") -> Forward:
        from candle_nn_models.yolo_v8 import YoloV8

        return YoloV8.load(vb, size, num_classes=80, fold_bn=False)
    return build


def _yolo_train_torch(size: str) -> Callable[[], Any]:
    """ultralytics' ``DetectionModel`` (80 classes) with its default hyperparameters as
    ``args``, which its ``loss(batch, preds)`` (``v8DetectionLoss``) reads, as its trainer sets."""
    def build() -> Any:
        import os

        os.environ.setdefault("YOLO_OFFLINE", "1")
        from ultralytics.cfg import get_cfg
        from ultralytics.nn.tasks import DetectionModel

        model = DetectionModel(f"yolov8{size}.yaml", nc=80, verbose=False)
        model.args = get_cfg()
        return model
    return build


def _yolo_torch(size: str, task: str = "detect", family: str = "yolov8") -> Callable[[], Any]:
    """ultralytics' model of ``{family}{size}[-seg].yaml`` (``yolov8``, ``yolo11``)."""
    def build() -> Any:
        import os

        import torch
        os.environ.setdefault("YOLO_OFFLINE", "1")
        from ultralytics.nn.tasks import DetectionModel, SegmentationModel

        model, suffix = ((SegmentationModel, "-seg") if task == "segment"
                         else (DetectionModel, ""))

        class Pred(torch.nn.Module):
            """ultralytics' eval forward returns (pred, features): keep pred (N, 84, anchors);
            segmentation's pred is (pred (N, 116, anchors), protos (N, 32, H/4, W/4))."""

            def __init__(self) -> None:
                super().__init__()
                # fuse() folds BN into the convs, as ultralytics' own predictor does.
                self.net = model(f"{family}{size}{suffix}.yaml", verbose=False).fuse(verbose=False)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                out = self.net(x)
                return out[0] if isinstance(out, (tuple, list)) else out

        return Pred()
    return build


# -- MobileSAM -------------------------------------------------------------------------------------
# The PyTorch reference: ultralytics' port of MobileSAM (TinyViT-5M image encoder, SAM's prompt
# encoder and mask decoder), built without a checkpoint.
_POINT = (580.0 * 1024 / 800, 240.0 * 1024 / 800)  # the fixture's prompt, in 1024-pixel space


_mobile_sam = _ours("mobile_sam", "tiny")


def _sam_encoder_ours(vb: "VarBuilder") -> Forward:
    return _mobile_sam(vb).image_encoder


def _sam_encoder_torch() -> Any:
    from ultralytics.models.sam.build import build_mobile_sam

    return build_mobile_sam(None).image_encoder


def _sam_decoder_inputs(n: int, rng: Any) -> tuple:
    """One image's embeddings (1, 64, 64, 256) and ``n`` single-point prompts: SAM's decoder
    batches prompts, not images."""
    import numpy as np

    embeddings = rng.standard_normal((1, 64, 64, 256), dtype=np.float32)
    jitter = rng.uniform(-64, 64, (n, 1, 2))
    coords = (np.array(_POINT, dtype=np.float32) + jitter).astype(np.float32)
    labels = np.ones((n, 1), dtype=np.int32)
    return embeddings, coords, labels


def _sam_decoder_ours(vb: "VarBuilder") -> Forward:
    import candle_nn as cn
    from candle_nn_models.segment_anything import Sam

    class PromptDecode(cn.Module):
        """Prompt encoder + mask decoder: embeddings (1, 64, 64, 256), points (n, 1, 2) xy in
        1024-pixel space, labels (n, 1) → low-res masks (n, 256, 256, 3), IoU (n, 3)."""

        def __init__(self, sam: Sam) -> None:
            super().__init__(sam.device)
            self.sam = sam

        def forward(self, embeddings: "mx.array", coords: "mx.array", labels: "mx.array") -> Any:
            return self.sam(embeddings, (coords, labels), multimask_output=True)

    return PromptDecode(_mobile_sam(vb))


def _sam_decoder_torch() -> Any:
    import torch
    from ultralytics.models.sam.build import build_mobile_sam

    class PromptDecode(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            sam = build_mobile_sam(None)
            self.prompt_encoder, self.mask_decoder = sam.prompt_encoder, sam.mask_decoder

        def forward(self, embeddings, coords, labels):
            sparse, dense = self.prompt_encoder(points=(coords, labels), boxes=None, masks=None)
            return self.mask_decoder(embeddings, self.prompt_encoder.get_dense_pe(), sparse, dense,
                                     multimask_output=True)

    return PromptDecode()


def _no_torch_module() -> Any:
    raise NotImplementedError("a pipeline: benchmarks/bench_amg.py builds its PyTorch side")


def _registry() -> dict[str, BenchModel]:
    tv = None if _have("torchvision") else "torchvision (pip install 'candle-nn-mlx[bench]')"
    ul = None if _have("ultralytics") else "ultralytics (pip install ultralytics)"
    ms = None if _have("mobile_sam") else "mobilesam-mirror (pip install 'candle-nn-mlx[bench]')"
    models = [
        BenchModel("resnet18", (224, 224), 8, "resnet18",
                   _resnet_ours("resnet18"), _resnet_torch("resnet18"), tv),
        BenchModel("resnet50", (224, 224), 8, None,
                   _resnet_ours("resnet50"), _resnet_torch("resnet50"), tv),
        BenchModel("yolov8n", (640, 640), 4, "yolov8n",
                   _yolo_ours("n"), _yolo_torch("n"), ul),
        BenchModel("yolov8s", (640, 640), 4, None,
                   _yolo_ours("s"), _yolo_torch("s"), ul),
        BenchModel("yolo11n", (640, 640), 4, None,
                   _ours("yolo11", "n", num_classes=80), _yolo_torch("n", family="yolo11"), ul),
        # Detection + mask coefficients and prototypes (the masks' NumPy post-processing is not
        # timed, as NMS is not for yolov8n).
        BenchModel("yolov8n-seg", (640, 640), 4, None,
                   _ours("yolo_v8_seg", "n", num_classes=80, num_masks=32),
                   _yolo_torch("n", "segment"), ul),
        BenchModel("mobilesam-encoder", (1024, 1024), 2, "mobile_sam",
                   _sam_encoder_ours, _sam_encoder_torch, ul),
        # Prompt encoder + mask decoder on one image's embeddings; the batch is of point prompts.
        BenchModel("mobilesam-decoder", (64, 64), 8, "mobile_sam",
                   _sam_decoder_ours, _sam_decoder_torch, ul, _sam_decoder_inputs),
        # Automatic masks end to end (one image, 32x32 point prompts) vs MobileSAM's own generator.
        BenchModel("mobilesam-amg", (556, 800), 1, "mobile_sam",
                   _mobile_sam, _no_torch_module, ms, pipeline=True),
        # Training steps (benchmarks/bench_train.py): train-mode BatchNorm, SGD; batch per step.
        BenchModel("resnet18-train", (224, 224), 16, None,
                   _resnet_train_ours("resnet18"), _resnet_train_torch("resnet18"),
                   train="classify"),
        BenchModel("resnet50-train", (224, 224), 16, None,
                   _resnet_train_ours("resnet50"), _resnet_train_torch("resnet50"),
                   train="classify"),
        BenchModel("yolov8n-train", (640, 640), 16, None,
                   _yolo_train_ours("n"), _yolo_train_torch("n"), ul, train="detect"),
    ]
    return {m.name: m for m in models}


MODELS = _registry()
QUICK_MODELS = ("resnet18", "resnet18-train")
TRAIN_MODELS = tuple(name for name, m in MODELS.items() if m.train)
