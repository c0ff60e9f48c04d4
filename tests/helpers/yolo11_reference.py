"""ultralytics YOLO models built from their YAML with seeded weights that give detections: the
tests' reference for YOLO11 (no download).

Freshly initialised (PyTorch's default init shrinks activations layer after layer), a deep
model's features are nearly constant, its class logits sit near ultralytics' prior bias (about -8,
no score above 0.001) and every box has the same size, so a prediction would compare nothing.
:func:`seeded_model` draws every convolution Kaiming-normal (variance-preserving), non-trivial
BatchNorm statistics (so folding is exercised), and rescales the head's last convolutions so
that the class logits spread around -4 (std 2.5), the DFL logits favour short box sides and
keypoint offsets stay within a few cells (DFL projection kept 0..15).
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from conftest import fixture_dir
from helpers.ultralytics_reference import import_ultralytics


def seeded_model(yaml: str, x: np.ndarray, *, nc: int | None = None,
                 seed: int = 0) -> torch.nn.Module:
    """ultralytics' ``DetectionModel`` / ``PoseModel`` / ``SegmentationModel`` of ``yaml`` (by
    its task), in eval mode, its head calibrated on the input ``x`` ``(1, 3, H, W)``."""
    import_ultralytics()
    from ultralytics.nn.tasks import DetectionModel, PoseModel, SegmentationModel

    torch.manual_seed(seed)
    cls = (PoseModel if "-pose" in yaml else SegmentationModel if "-seg" in yaml
           else DetectionModel)
    kwargs = {} if nc is None else {"nc": nc}
    model = cls(yaml, verbose=False, **kwargs).eval()
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):  # so that deep features do not fade to constants
            torch.nn.init.kaiming_normal_(m.weight, nonlinearity="linear")
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    head = model.model[-1]
    with torch.no_grad():
        head.dfl.conv.weight.copy_(torch.arange(float(head.reg_max)).view(1, -1, 1, 1))
        tilt = (-0.6 * torch.arange(float(head.reg_max))).repeat(4)  # short box sides
        x = torch.from_numpy(x)
        _calibrate(model, x, [b[2] for b in head.cv3], mean=-4.0, std=2.5)
        _calibrate(model, x, [b[2] for b in head.cv2], mean=0.0, std=1.5, bias=tilt)
        if hasattr(head, "cv4"):  # keypoints, or mask coefficients (mostly positive: masks)
            _calibrate(model, x, [b[2] for b in head.cv4], std=1.0,
                       mean=1.0 if hasattr(head, "proto") else 0.0)
    model.names = {i: f"class{i}" for i in range(head.nc)}
    return model


def _calibrate(model: torch.nn.Module, x: torch.Tensor, convs: list[torch.nn.Conv2d], *,
               mean: float, std: float, bias: torch.Tensor | float = 0.0) -> None:
    """Rescale the last convolutions of a head branch so that, on ``x``, their outputs have
    ``mean`` and ``std`` (plus ``bias`` per output channel)."""
    outs = []
    hooks = [c.register_forward_hook(lambda m, i, o: outs.append(o.flatten())) for c in convs]
    model(x)
    for h in hooks:
        h.remove()
    found = torch.cat(outs)
    gain = std / float(found.std())
    for conv in convs:
        conv.weight.mul_(gain)
        conv.bias.copy_((conv.bias - found.mean()) * gain + mean + bias)


def bike(height: int, width: int) -> np.ndarray:
    """bike.jpg resized to ``height × width``, ``(1, 3, H, W)`` float32 in [0, 1] (NCHW)."""
    image = Image.open(fixture_dir("images") / "bike.jpg").convert("RGB")
    rgb = np.asarray(image.resize((width, height), Image.BILINEAR), dtype=np.float32) / 255.0
    return np.ascontiguousarray(rgb.transpose(2, 0, 1)[None])


def float32_tolerance(model: torch.nn.Module, x: np.ndarray) -> tuple[dict, float]:
    """The reference's float64 outputs for ``x`` as NumPy (``pred``: the eval-mode prediction,
    ``boxes`` / ``scores`` / pose ``kpts``: the raw head outputs), and the float32 tolerance of
    ``../shared/fixtures/README.md``: 10× the reference's own float32-vs-float64 error (relative
    to the largest value), floored at 1e-4."""
    with torch.no_grad():
        y32, raw32 = model.float()(torch.from_numpy(x))
        y64, raw64 = model.double()(torch.from_numpy(x).double())
    model.float()
    want = {"pred": y64.numpy(), **{k: v.numpy() for k, v in raw64.items() if k != "feats"}}
    got32 = {"pred": y32.numpy(), **{k: v.numpy() for k, v in raw32.items() if k != "feats"}}
    err = max(np.abs(got32[k] - want[k]).max() / np.abs(want[k]).max() for k in want)
    return want, max(10 * float(err), 1e-4)
