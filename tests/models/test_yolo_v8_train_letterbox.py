"""A YOLOv8 training step on letterboxed images against ultralytics: YOLOv8n with 3 classes, a
batch of 3 at 320x320 (grey padding bands; one image a 800x40 strip, nearly all padding),
BatchNorm on batch statistics, ultralytics' ``v8DetectionLoss``. Every parameter's gradient
within the fixtures' rule: 10x the reference's own float32-vs-float64 relative L2 error, floored
at 1e-4.

What the padding stresses: BatchNorm's batch statistics over constant regions (each padded row
adds the same float32 rounding to a single running sum: 1e-2 relative L2 in backbone gradients,
50x the tolerance, before ``ops.channel_sum``), and max pooling's ties in SPPF, which
pools its own pooled maps (PyTorch's rule there: tests/candle_nn/test_subgradients.py; ties
between positions that see the same input give the same parameter gradients either way)."""

from __future__ import annotations

import copy

import numpy as np
import torch
from conftest import FIXTURES
from PIL import Image

import candle_nn as cn
import mlx.core as mx
import mlx.nn as nn
from candle_nn.checkpoint import state_dict
from candle_nn_models.letterbox import letterbox
from candle_nn_models.weights.convert import convert_ultralytics
from candle_nn_models.yolo_v8 import YoloV8
from candle_nn_models.yolo_v8_loss import DetectionLoss
from helpers.ultralytics_models import seeded
from helpers.yolo_loss_reference import rel_l2

SIZE, CLASSES = 320, 3


def _batch() -> tuple[np.ndarray, np.ndarray]:
    """``(3, SIZE, SIZE, 3)`` float images in [0, 1] and ``(n, 6)`` targets (image, class,
    normalised cx, cy, w, h)."""
    bike = np.asarray(Image.open(FIXTURES / "images" / "bike.jpg").convert("RGB"))
    images = [bike, bike[:, ::-1], bike[200:240]]  # the last one 800x40: mostly padding
    x = np.stack([letterbox(np.ascontiguousarray(im), SIZE).as_input()[0] for im in images])
    targets = np.array([[0, 0, 0.5, 0.5, 0.6, 0.5], [0, 2, 0.3, 0.45, 0.2, 0.3],
                        [1, 1, 0.45, 0.5, 0.5, 0.4], [2, 2, 0.5, 0.5, 0.9, 0.15],
                        [2, 0, 0.2, 0.5, 0.2, 0.1]], np.float32)
    return x.astype(np.float32), targets


def _ultralytics_grads(net, x: np.ndarray, targets: np.ndarray, dtype) -> dict[str, np.ndarray]:
    from ultralytics.cfg import get_cfg

    net = copy.deepcopy(net).to(dtype).train()
    net.args = get_cfg()
    img = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(dtype)
    t = torch.from_numpy(targets).to(dtype)
    batch = {"img": img, "batch_idx": t[:, 0], "cls": t[:, 1:2], "bboxes": t[:, 2:6]}
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # the tensors the loss makes itself (padded targets)
    try:
        net.loss(batch, net(img))[0].sum().backward()
    finally:
        torch.set_default_dtype(default)
    grads = {k: p.grad.double().numpy() for k, p in net.named_parameters()
             if p.grad is not None}  # not the DFL projection (frozen)
    return convert_ultralytics(grads, source="grads").tensors


def test_gradients_on_letterboxed_images_match_ultralytics() -> None:
    net = seeded("DetectionModel", "yolov8n.yaml", nc=CLASSES)
    x, targets = _batch()
    ref64 = _ultralytics_grads(net, x, targets, torch.float64)
    ref32 = _ultralytics_grads(net, x, targets, torch.float32)

    state = {k: v.numpy() for k, v in net.state_dict().items()
             if not k.endswith("num_batches_tracked")}
    tensors = convert_ultralytics(state, source="seeded").tensors
    vb = cn.VarBuilder.from_tensors({k: mx.array(v) for k, v in tensors.items()},
                                    device=cn.Device.cpu())
    model = YoloV8.load(vb, "n", num_classes=CLASSES, fold_bn=False).train()
    criterion = DetectionLoss(CLASSES, device=cn.Device.cpu())
    loss_and_grad = nn.value_and_grad(model, lambda m, x, t: criterion(m(x), t)[0])
    loss, grads = loss_and_grad(model, mx.array(x), mx.array(targets))
    mx.eval(loss, grads)
    model.update(grads)  # name the gradients as the weights (candle names, PyTorch layout)
    ours = state_dict(model)

    assert len(ref64) > 100
    worst = []
    for name, want in ref64.items():
        if not np.abs(want).max():
            continue  # no gradient reaches it in this batch
        tol = max(1e-4, 10 * rel_l2(ref32[name], want))
        err = rel_l2(np.array(ours[name]), want)
        worst.append((err / tol, name, err, tol))
    worst.sort(reverse=True)
    assert worst[0][0] <= 1, [f"{n}: {e:.2e} > {t:.1e}" for r, n, e, t in worst if r > 1]
