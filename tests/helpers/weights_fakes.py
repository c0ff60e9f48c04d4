"""Test helpers for the weights converters: checkpoints built in the test, with torch only.

* :func:`random_candle_tensors` — random values (positive BatchNorm variances) for a
  ``name -> shape`` table.
* :func:`ultralytics_checkpoint` — an ultralytics-style ``.pt`` (a pickled ``DetectionModel`` /
  ``PoseModel`` object tree) from candle-named tensors. The inverse name map comes from the
  shared fixture's ``meta.json`` (``name_map``), not from the converter under test. The classes are
  fakes registered in ``sys.modules`` under ultralytics' module paths for the dump only:
  ultralytics is not needed.
"""

from __future__ import annotations

import importlib
import pathlib
import sys
import types
from contextlib import contextmanager
from typing import Iterator, Mapping

import numpy as np

ULTRA_LAYER_CLASSES = {  # yolov8.yaml: index -> (module, class)
    **{i: ("ultralytics.nn.modules.conv", "Conv") for i in (0, 1, 3, 5, 7, 16, 19)},
    **{i: ("ultralytics.nn.modules.block", "C2f") for i in (2, 4, 6, 8, 12, 15, 18, 21)},
    9: ("ultralytics.nn.modules.block", "SPPF"),
    **{i: ("torch.nn.modules.upsampling", "Upsample") for i in (10, 13)},
    **{i: ("ultralytics.nn.modules.conv", "Concat") for i in (11, 14, 17, 20)},
}
CONV = ("ultralytics.nn.modules.conv", "Conv")
TORCH_CONV = ("torch.nn.modules.conv", "Conv2d")


def _child_class(path: list[str], part: str) -> tuple[str, str]:
    """The class ultralytics uses for child ``part`` of the module at ``model.<path>``."""
    head = path[0] == "22"
    if part == "conv":
        return TORCH_CONV
    if part == "bn":
        return ("torch.nn.modules.batchnorm", "BatchNorm2d")
    if part in ("m", "cv2", "cv3", "cv4") and (part == "m" or head) and len(path) == 1:
        return ("torch.nn.modules.container", "ModuleList")
    if part == "dfl":
        return ("ultralytics.nn.modules.block", "DFL")
    if path[-1] == "m":
        return ("ultralytics.nn.modules.block", "Bottleneck")
    if head and len(path) == 2:  # cv2.0 …: Sequential(Conv, Conv, Conv2d)
        return ("torch.nn.modules.container", "Sequential")
    if head and len(path) == 3:
        return TORCH_CONV if part == "2" else CONV
    return CONV


def random_candle_tensors(shapes: Mapping[str, tuple[int, ...]],
                          seed: int) -> dict[str, np.ndarray]:
    """float32 random values; ``running_var`` positive so BatchNorm stays finite."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        value = rng.standard_normal(shape).astype(np.float32) * 0.1
        if name.endswith("running_var"):
            value = np.abs(value) + 0.5
        out[name] = value
    return out


def candle_to_ultralytics(tensors: Mapping[str, np.ndarray],
                          name_map: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Invert the fixture's ``name_map`` (``"4": "net.b2.2"``, ``"C2f m.N": "bottleneck.N"``)."""
    layer_of = {v: k for k, v in name_map.items() if k.isdigit()}
    out = {}
    for name, value in tensors.items():
        prefix = next(p for p in sorted(layer_of, key=len, reverse=True)
                      if name.startswith(p + "."))
        rest = name[len(prefix) + 1:]
        if rest.startswith("bottleneck."):
            rest = "m." + rest[len("bottleneck."):]
        out[f"model.{layer_of[prefix]}.{rest}"] = value
    return out


@contextmanager
def fake_modules() -> Iterator[dict[tuple[str, str], type]]:
    """Fake ultralytics classes, registered in sys.modules while the block runs (torch.nn
    classes are the real ones)."""
    made: dict[tuple[str, str], type] = {}
    saved = {}

    def cls(module: str, name: str) -> type:
        if module.startswith("torch."):  # real torch.nn classes, pickled as ultralytics does
            return getattr(importlib.import_module(module), name)
        if (module, name) not in made:
            parts = module.split(".")
            for depth in range(1, len(parts) + 1):  # pickle imports the parent packages too
                pkg = ".".join(parts[:depth])
                if pkg not in saved:
                    saved[pkg] = sys.modules.get(pkg)
                    sys.modules[pkg] = types.ModuleType(pkg)
            base = types.SimpleNamespace if name == "IterableSimpleNamespace" else _torch_module()
            klass = type(name, (base,), {"__module__": module, "__qualname__": name})
            setattr(sys.modules[module], name, klass)
            made[(module, name)] = klass
        return made[(module, name)]

    made["factory"] = cls  # type: ignore[index]
    try:
        yield made
    finally:
        for module, old in saved.items():
            if old is None:
                sys.modules.pop(module, None)
            else:
                sys.modules[module] = old


def _torch_module() -> type:
    import torch

    return torch.nn.Module


def _node(cls: type, **attrs) -> object:
    """An ``nn.Module`` of class ``cls`` with the full state a real one pickles (hook dicts,
    ``training``…), built without calling ``cls.__init__`` (whose arguments we do not know)."""
    import torch

    obj = cls.__new__(cls)
    torch.nn.Module.__init__(obj)
    obj.eval()
    obj.__dict__.update(attrs)
    return obj


def ultralytics_checkpoint(ultra: Mapping[str, np.ndarray], *, pose: bool, names: dict[int, str],
                           factory, model_class: str | None = None) -> dict:
    """The dict ultralytics saves (``{"model": None, "ema": DetectionModel, …}``) around a model
    tree holding ``ultra`` (``model.N.*`` names), as torch Parameters / buffers, in float16."""
    import torch

    head_cls = ("ultralytics.nn.modules.head", "Pose" if pose else "Detect")
    top_cls = model_class or ("PoseModel" if pose else "DetectionModel")
    seq = _node(factory("torch.nn.modules.container", "Sequential"))
    layers = max(23, 1 + max(int(k.split(".")[1]) for k in ultra))
    for i in range(layers):
        module, name = head_cls if i == 22 else ULTRA_LAYER_CLASSES.get(
            i, ("ultralytics.nn.modules.conv", "Conv"))
        attrs = {"nc": len(names), "kpt_shape": [17, 3], "reg_max": 16,
                 "stride": torch.tensor([8.0, 16.0, 32.0])} if i == 22 else {"i": i, "f": -1}
        seq._modules[str(i)] = _node(factory(module, name), **attrs)
        if module.endswith(".conv") and name == "Conv":
            seq._modules[str(i)]._modules["act"] = torch.nn.SiLU(inplace=True)
        elif name == "SPPF":
            seq._modules[str(i)]._modules["m"] = torch.nn.MaxPool2d(5, 1, 2)
        elif name == "Upsample":
            seq._modules[str(i)] = torch.nn.Upsample(scale_factor=2.0, mode="nearest")
    for key, value in ultra.items():
        parts = key.split(".")
        node = seq._modules[parts[1]]
        for depth, part in enumerate(parts[2:-1], start=2):
            if part not in node._modules:
                node._modules[part] = _node(factory(*_child_class(parts[1:depth], part)))
            node = node._modules[part]
        t = torch.from_numpy(np.ascontiguousarray(value)).half()
        if parts[-1].startswith("running_"):
            node._buffers[parts[-1]] = t
        else:
            node._parameters[parts[-1]] = torch.nn.Parameter(t, requires_grad=False)
        if parts[-1] == "running_var":
            node._buffers["num_batches_tracked"] = torch.tensor(7)
    args = factory("ultralytics.utils", "IterableSimpleNamespace")(
        task="pose" if pose else "detect", imgsz=640)
    model = _node(factory("ultralytics.nn.tasks", top_cls), names=dict(names),
                  yaml={"nc": len(names)}, args=args)
    model._modules["model"] = seq
    return {"date": "2026-11-22T10:00:00", "version": "8.3.40", "model": None, "ema": model,
            "updates": 10, "optimizer": None, "train_args": {"epochs": 1, "imgsz": 640},
            "train_metrics": {"metrics/mAP50(B)": np.float64(0.25)},
            "train_results": {"epoch": np.arange(3), "path": pathlib.PurePosixPath("runs/a")}}


def save_ultralytics(path, ckpt_factory) -> None:
    """``torch.save`` a checkpoint built inside :func:`fake_modules` (so pickle finds the fakes)."""
    import torch

    with fake_modules() as made:
        torch.save(ckpt_factory(made["factory"]), path)
