"""MobileSAM's own code (PyPI ``mobilesam-mirror``, imports as ``mobile_sam``) with our
safetensors weights: the reference for the automatic mask generator, shared by its parity tests
(``tests/models/segment_anything/test_sam_automatic.py``) and ``candle-nn-bench``'s
``mobilesam-amg`` entry. Imports neither candle_nn nor MLX (a PyTorch worker must not load
candle_nn's BLAS).

MobileSAM imports two packages only for things inference does not use or that are one small
function: ``timm`` (``DropPath`` — identity at the drop rate 0 MobileSAM builds with —,
``to_2tuple``, ``trunc_normal_`` for random init, and a model registry decorator) and
torchvision (``ops.boxes.batched_nms``, ``ops.boxes.box_area``, and ``transforms.functional``'s
``to_pil_image`` + ``resize``, which on a PIL image are PIL's bilinear resize). PyPI's Linux
torchvision is built against CUDA torch and cannot load next to the CPU torch wheel of the
``test`` extra (its ``_C`` library needs ``libtorch_cuda.so``), and timm imports torchvision. So
when they cannot be imported, the stand-ins below take their place: the timm names behave as
timm's do at inference, and ``batched_nms`` is a line-by-line transcription of torchvision's CPU
NMS kernel (``torchvision/csrc/ops/cpu/nms_kernel.cpp``: sort by score, descending; drop boxes
whose IoU with a kept box is ``> iou_threshold``; IoU in the boxes' dtype) plus
``batched_nms``'s coordinate trick for categories. That NMS replaces the generator's
``batched_nms`` even where torchvision imports, for one reason: equal scores (every mask of a
crop has the same score in the NMS across crops) must be visited in a defined order — input
order, as ours does — where torchvision leaves it to torch's unstable sort. Everything else —
grids, crops, thresholds, stability score, RLEs, OpenCV's connected components, pycocotools — is
MobileSAM's own code.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import numpy as np


def _stand_in_timm() -> None:
    import torch

    class DropPath(torch.nn.Module):
        def __init__(self, drop_prob: float = 0.0) -> None:
            super().__init__()
            self.drop_prob = drop_prob

        def forward(self, x):
            assert self.drop_prob == 0.0 or not self.training
            return x

    def to_2tuple(x):
        return tuple(x) if isinstance(x, (tuple, list)) else (x, x)

    timm = types.ModuleType("timm")
    models = types.ModuleType("timm.models")
    layers = types.ModuleType("timm.models.layers")
    registry = types.ModuleType("timm.models.registry")
    layers.DropPath, layers.to_2tuple = DropPath, to_2tuple
    layers.trunc_normal_ = torch.nn.init.trunc_normal_
    registry.register_model = lambda fn: fn
    timm.models, models.layers, models.registry = models, layers, registry
    sys.modules.update({"timm": timm, "timm.models": models, "timm.models.layers": layers,
                        "timm.models.registry": registry})


def _nms(boxes, scores, iou_threshold: float):
    """torchvision's CPU ``nms`` kernel, transcribed, with a stable sort: equal scores are visited
    in input order (torch's default CPU sort, which the kernel calls, is not stable beyond 16
    elements, so torchvision leaves their order to the sort's internals)."""
    import torch

    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    x1, y1, x2, y2 = boxes.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    order = scores.sort(dim=0, descending=True, stable=True)[1]
    suppressed = torch.zeros(len(boxes), dtype=torch.bool)
    keep = []
    for _i in range(len(order)):
        i = order[_i]
        if suppressed[i]:
            continue
        keep.append(int(i))
        rest = order[_i + 1:]
        w = (torch.minimum(x2[i], x2[rest]) - torch.maximum(x1[i], x1[rest])).clamp(min=0)
        h = (torch.minimum(y2[i], y2[rest]) - torch.maximum(y1[i], y1[rest])).clamp(min=0)
        inter = w * h
        ovr = inter / (areas[i] + areas[rest] - inter)
        suppressed[rest[(ovr > iou_threshold) & ~suppressed[rest]]] = True
    return torch.tensor(keep, dtype=torch.long)


def batched_nms(boxes, scores, idxs, iou_threshold: float):
    """torchvision's ``batched_nms`` (the coordinate trick: boxes of other categories never
    overlap) over :func:`_nms`."""
    import torch

    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64)
    offsets = idxs.to(boxes) * (boxes.max() + torch.tensor(1).to(boxes))
    return _nms(boxes + offsets[:, None], scores, iou_threshold)


def _stand_in_torchvision_boxes() -> None:
    def box_area(boxes):
        return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])

    def to_pil_image(image):  # MobileSAM passes (H, W, 3) uint8 arrays
        from PIL import Image

        return Image.fromarray(np.asarray(image))

    def resize(image, size):  # torchvision on a PIL image: PIL's bilinear resize to (h, w)
        from PIL import Image

        return image.resize((size[1], size[0]), Image.BILINEAR)

    tv = types.ModuleType("torchvision")
    ops = types.ModuleType("torchvision.ops")
    boxes_mod = types.ModuleType("torchvision.ops.boxes")
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")
    boxes_mod.box_area, boxes_mod.batched_nms = box_area, batched_nms
    # ultralytics calls torchvision.ops.nms whenever a module named torchvision is imported
    ops.nms, ops.batched_nms, ops.box_area = _nms, batched_nms, box_area
    functional.resize, functional.to_pil_image = resize, to_pil_image
    tv.ops, ops.boxes, tv.transforms, transforms.functional = ops, boxes_mod, transforms, functional
    sys.modules.update({"torchvision": tv, "torchvision.ops": ops,
                        "torchvision.ops.boxes": boxes_mod, "torchvision.transforms": transforms,
                        "torchvision.transforms.functional": functional})


def import_mobile_sam(stable_nms: bool = True) -> tuple[types.ModuleType, list[str]]:
    """``mobile_sam`` and the list of stand-ins it needed (``[]`` when timm and torchvision
    import as they are). ``stable_nms``: the generator uses :func:`batched_nms` (the parity
    tests) even where torchvision imports; the benchmark keeps torchvision's C++/CUDA kernel."""
    stand_ins = []
    try:
        importlib.import_module("torchvision.ops.boxes")
        importlib.import_module("torchvision.transforms.functional")
    except Exception:  # ImportError, or RuntimeError from a CUDA-only build
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        _stand_in_torchvision_boxes()
        stand_ins.append("torchvision")
    try:
        importlib.import_module("timm.models.layers")
    except Exception:  # as above
        for name in [m for m in sys.modules if m == "timm" or m.startswith("timm.")]:
            del sys.modules[name]
        _stand_in_timm()
        stand_ins.append("timm")
    module = importlib.import_module("mobile_sam")
    # The stable-tie NMS for parity: the masks of one crop all share one score in the NMS across
    # crops, and their order must not depend on a sort's internals.
    if stable_nms:
        importlib.import_module("mobile_sam.automatic_mask_generator").batched_nms = batched_nms
    return module, stand_ins


def build_reference_sam(weights: str | Path, device: str = "cpu"):
    """MobileSAM's ``vit_t`` model in eval mode on ``device`` (a torch device) with the weights of
    a safetensors file in MobileSAM's (= candle's) names, as float32 (the fixture stores float16);
    TinyViT's cached attention biases are re-gathered after loading."""
    import torch
    from safetensors.numpy import load_file

    mobile_sam = sys.modules.get("mobile_sam") or import_mobile_sam()[0]
    model = mobile_sam.sam_model_registry["vit_t"]()
    state = {k: torch.from_numpy(v.astype(np.float32)) for k, v in load_file(str(weights)).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not missing, f"{weights} lacks MobileSAM tensors: {missing[:5]}"
    model.to(device)
    model.train(True)
    model.eval()  # re-gathers TinyViT's attention-bias cache ("ab") from the loaded biases
    return model
