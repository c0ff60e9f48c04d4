"""Convert users' PyTorch checkpoints to safetensors under candle's names.

Sources (``--from``):

* ``torchvision`` / ``timm``: ResNet-18/34/50/101/152 ``state_dict``s. Their names already are
  candle's; a wrapping prefix (``module.``, ``backbone.``, ``model.`` …) is stripped, BatchNorm's
  ``num_batches_tracked`` dropped, any head size kept.
* ``ultralytics``: YOLOv8 and YOLO11 detection, pose, segmentation and classification ``.pt``
  files (any class count), the version recognised from the layers
  (C2f, or C3k2 + C2PSA). YOLOv8's layer ``model.N`` becomes candle's ``net.*`` / ``fpn.*`` /
  ``head`` (:data:`YOLO_LAYER_NAMES`; a classifier's: :data:`YOLO_CLS_LAYER_NAMES`), a C2f's
  ``m.K`` its ``bottleneck.K``; inside the head, whose segmentation and classification parts
  candle does not have, ultralytics' module names stay (``cv4``, ``proto``, ``conv``,
  ``linear``). YOLO11 (no candle names at all) keeps ultralytics' ``model.N.*``. The
  checkpoint's class names are kept in the metadata; YOLOv5u, YOLO26 and OBB files are named and
  refused.
* ``mobile_sam``: MobileSAM's ``mobile_sam.pt`` ``state_dict``; names are candle's already,
  the ``attention_bias_idxs`` index buffers (candle recomputes them) are dropped.

Every converted file is checked against our model (:mod:`candle_nn_models.weights.spec`) before it
is written and carries the ``candle_nn.*`` metadata of :mod:`candle_nn_models.weights.metadata`.
Tensors keep their dtype.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from candle_nn import CandleNNError, VarBuilder, WeightsFileError
from candle_nn.atomic_write import atomic_write
from candle_nn.checkpoint import BN_EPS_KEY, BN_MOMENTUM_KEY
from candle_nn_models.resnet_network import infer_variant
from candle_nn_models.training_size import IMGSZ_KEY, PREPROCESS_KEY
from candle_nn_models.yolo11 import Yolo11Spec
from candle_nn_models.yolo_checkpoint import infer_spec
from candle_nn_models.yolo_v8 import YoloV8Spec

from .metadata import TASKS, WeightsMetadata
from .spec import ModelUnavailableError
from .torch_pickle import (
    EMA_KEYS, FUSED_MODEL, ConversionError, StandIn, load_state_dict, load_ultralytics,
    module_state_dict, to_numpy, unwrap_state_dict,
)
from .ultralytics_inputs import classify_preprocess, training_imgsz

SOURCES = ("torchvision", "timm", "ultralytics", "mobile_sam")

# ultralytics yolov8.yaml layer index -> candle's module path (candle's yolo-v8 model.rs).
# Layers 10, 11, 13, 14, 17, 20 (upsample / concat) hold no weights.
YOLO_LAYER_NAMES: dict[int, str] = {
    0: "net.b1.0", 1: "net.b1.1", 2: "net.b2.0", 3: "net.b2.1", 4: "net.b2.2", 5: "net.b3.0",
    6: "net.b3.1", 7: "net.b4.0", 8: "net.b4.1", 9: "net.b5.0", 12: "fpn.n1", 15: "fpn.n2",
    16: "fpn.n3", 18: "fpn.n4", 19: "fpn.n5", 21: "fpn.n6", 22: "head",
}
YOLO_HEAD_INDEX = 22
# yolov8-cls.yaml: the backbone's first nine layers (as above), then the Classify head.
YOLO_CLS_LAYER_NAMES: dict[int, str] = {**{i: YOLO_LAYER_NAMES[i] for i in range(9)}, 9: "head"}
YOLO_CLS_HEAD_INDEX = 9
# ultralytics' model classes this converter takes; any other names what it is in the error
YOLO_MODEL_CLASSES = ("DetectionModel", "PoseModel", "SegmentationModel", "ClassificationModel")

_DROPPED_SUFFIXES = ("num_batches_tracked", "attention_bias_idxs")


@dataclass
class Converted:
    """Tensors under candle's names plus the metadata to write, and what was left out."""

    tensors: dict[str, np.ndarray]
    metadata: WeightsMetadata
    dropped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# -- helpers ----------------------------------------------------------------------------------
def _strip_prefix(sd: Mapping[str, Any], anchors: Sequence[str], what: str,
                  where: str) -> tuple[str, dict[str, Any], list[str]]:
    """Find the prefix ``P`` under which every anchor name exists; ``(P, stripped, outside)``."""
    candidates = sorted({k[: -len(anchors[0])] for k in sd if k.endswith(anchors[0])}, key=len)
    for prefix in candidates:
        if all(prefix + a in sd for a in anchors):
            inside = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
            return prefix, inside, [k for k in sd if not k.startswith(prefix)]
    sample = ", ".join(list(sd)[:6])
    raise ConversionError(
        f"{where} does not look like a {what} state_dict: no prefix P with "
        f"{' and '.join('P+' + repr(a) for a in anchors)} (its first names: {sample})")


def _drop_buffers(sd: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    kept = {k: v for k, v in sd.items() if not k.endswith(_DROPPED_SUFFIXES)}
    return kept, [k for k in sd if k not in kept]


def _check_count(found: int | None, wanted: int | None, what: str) -> None:
    if wanted is not None and found != wanted:
        raise ConversionError(
            f"--num-classes {wanted} does not match the checkpoint, whose head has {found} {what}")


def _check_names(names: list[str] | None, num_classes: int | None, where: str) -> list[str] | None:
    if names is not None and num_classes is not None and len(names) != num_classes:
        raise ConversionError(
            f"{len(names)} class names from {where} for a head of {num_classes} classes: give "
            "one name per class, in index order")
    return names


def read_names(path: "str | os.PathLike") -> list[str]:
    """Class names from a text file (one per line) or a JSON list / ``{index: name}`` dict."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConversionError(
            f"cannot read class names from {path}: {exc.strerror or exc}") from exc
    if str(path).endswith(".json"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConversionError(f"{path} is not valid JSON ({exc})") from exc
        return names_from(data, str(path))
    return [line.strip() for line in text.splitlines() if line.strip()]


def names_from(data: Any, where: str) -> list[str]:
    """ultralytics' ``names`` (``{0: "person", …}`` or a list) as a list in index order."""
    if isinstance(data, StandIn):  # a dict subclass rebuilt by the restricted unpickler
        data = data.__dict__.get("items", data.__dict__.get("list"))
    if isinstance(data, (list, tuple)):
        return [str(n) for n in data]
    if isinstance(data, dict):
        try:
            keys = sorted(data, key=int)
        except (TypeError, ValueError):
            raise ConversionError(f"class names in {where} are not indexed by integers") from None
        if [int(k) for k in keys] != list(range(len(keys))):
            raise ConversionError(f"class names in {where} are not indexed 0..{len(keys) - 1}")
        return [str(data[k]) for k in keys]
    raise ConversionError(f"class names in {where} are a {type(data).__name__}, not a list/dict")


def _numpy(sd: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {k: to_numpy(v) for k, v in sd.items()}


def _shapes_only(tensors: Mapping[str, Any]) -> VarBuilder:
    """A VarBuilder over ``tensors``' names and shapes, for the models' checkpoint inspection
    (``infer_variant``, ``infer_spec``); nothing is copied."""
    zero = np.zeros((), np.uint8)
    return VarBuilder.from_tensors({k: np.broadcast_to(zero, tuple(v.shape))
                                    for k, v in tensors.items()})


# -- ResNet (torchvision / timm) -------------------------------------------------------------------
def convert_resnet(sd: Mapping[str, Any], *, source: str, variant: str | None = None,
                   num_classes: int | None = None, names: list[str] | None = None) -> Converted:
    """A torchvision/timm ResNet state_dict (any prefix, any head size) → candle names."""
    prefix, inner, outside = _strip_prefix(sd, ("conv1.weight", "layer1.0.conv1.weight"),
                                           "ResNet", source)
    inner, dropped = _drop_buffers(inner)
    inner, wrapped = _unwrap_fc(inner, source)
    try:
        found, classes = infer_variant(_shapes_only(inner), source)
    except CandleNNError as exc:
        raise ConversionError(str(exc)) from exc
    if variant is not None and variant != found:
        raise ConversionError(f"--variant {variant} given, but {source} holds a {found}")
    _check_count(classes, num_classes, "classes")
    converted = Converted(_numpy(inner), WeightsMetadata(
        model="resnet", variant=found, task=TASKS["resnet"], num_classes=classes,
        names=_check_names(names, classes, "--names"), source=source,
        extra=_bn_metadata(*TORCH_BN)), dropped=dropped + outside)
    if prefix:
        converted.notes.append(f"stripped prefix '{prefix}'")
    if wrapped:
        converted.notes.append(f"the head {wrapped}.* (a Linear inside a Sequential, e.g. after a "
                               "Dropout) became fc.*")
    if outside:
        converted.notes.append(f"ignored {len(outside)} tensors outside '{prefix}'")
    return converted


def _unwrap_fc(sd: dict[str, Any], where: str) -> tuple[dict[str, Any], str | None]:
    """A head ``fc = Sequential(Dropout, Linear)`` (``fc.1.weight``) as candle's ``fc.weight``;
    ``(sd, the wrapped name or None)``. A head of several layers (an MLP) has no candle
    equivalent: ConversionError."""
    if "fc.weight" in sd or not any(k.startswith("fc.") for k in sd):
        return sd, None
    layers = sorted({k.split(".")[1] for k in sd if k.startswith("fc.")})
    linear = [i for i in layers if f"fc.{i}.weight" in sd and len(sd[f"fc.{i}.weight"].shape) == 2]
    if len(layers) != 1 or len(linear) != 1:
        raise ConversionError(
            f"{where}: the head fc is a Sequential with weights in {len(layers)} layers "
            f"({', '.join('fc.' + i for i in layers)}); candle's ResNet head is one Linear "
            "(fc.weight, fc.bias). Replace the head by one Linear (or drop it for a headless "
            "backbone) before converting")
    name = f"fc.{linear[0]}"
    return {(("fc" + k[len(name):]) if k.startswith(name + ".") else k): v
            for k, v in sd.items()}, name


# -- ultralytics YOLOv8 ----------------------------------------------------------------------------
def _yolo_name(key: str, where: str, classifier: bool = False) -> str:
    parts = key.split(".")
    if len(parts) < 3 or parts[0] != "model" or not parts[1].isdigit():
        raise ConversionError(f"{where}: tensor '{key}' is not an ultralytics 'model.N.*' name")
    index = int(parts[1])
    names, head = ((YOLO_CLS_LAYER_NAMES, YOLO_CLS_HEAD_INDEX) if classifier
                   else (YOLO_LAYER_NAMES, YOLO_HEAD_INDEX))
    if index not in names:
        what = "YOLOv8-cls" if classifier else "YOLOv8 detect/pose/segment"
        raise ConversionError(
            f"{where}: layer {index} ('{key}') has weights, which a {what} model does not: this "
            "is another architecture (YOLOv5u/YOLO11/YOLO26/a custom yaml?)")
    rest = parts[2:]
    if index != head and rest[0] == "m":  # C2f.m[k] -> candle's bottleneck.k
        rest = ["bottleneck", *rest[1:]]
    return ".".join([names[index], *rest])


def _ultralytics_model(ckpt: Any, where: str) -> tuple[dict[str, Any], Any, Any]:
    """``(state_dict, names or None, layer stand-ins or None)`` of an unpickled ultralytics
    file."""
    if isinstance(ckpt, StandIn):
        model = ckpt
    elif isinstance(ckpt, dict):
        model = ckpt.get("ema") or ckpt.get("model")  # ultralytics' own choice (EMA first)
        if model is None:
            return unwrap_state_dict(ckpt, where), None, None
    else:
        raise ConversionError(
            f"{where} holds a {type(ckpt).__name__}, not an ultralytics checkpoint")
    if isinstance(model, dict):
        return unwrap_state_dict(model, where), None, None
    if not isinstance(model, StandIn):
        raise ConversionError(f"{where}: 'model' is a {type(model).__name__}, not a model")
    cls = model.qualname.rsplit(".", 1)[-1]
    if cls not in YOLO_MODEL_CLASSES:
        raise ConversionError(
            f"{where} holds an ultralytics {cls}; only {', '.join(YOLO_MODEL_CLASSES)} (YOLOv8 "
            "and YOLO11 detect, pose, segment and classify) are supported")
    layers = (model.__dict__.get("_modules") or {}).get("model")
    children = list((getattr(layers, "__dict__", {}).get("_modules") or {}).values())
    return dict(module_state_dict(model)), model.__dict__.get("names"), children or None


def _ultralytics_module(ckpt: Any) -> Any:
    """The pickled model object of an ultralytics file (as :func:`_ultralytics_model` picks
    it), or ``None`` for a state_dict."""
    model = ckpt.get("ema") or ckpt.get("model") if isinstance(ckpt, dict) else ckpt
    return model if isinstance(model, StandIn) else None


# BatchNorm settings of a source that holds only tensors: PyTorch's defaults (torchvision, timm,
# MobileSAM, ultralytics' classifiers), and ultralytics' initialize_weights for its detectors.
TORCH_BN = (1e-5, 0.1)
ULTRALYTICS_DETECT_BN = (1e-3, 0.03)


def _bn_metadata(eps: float, momentum: float) -> dict[str, str]:
    return {BN_EPS_KEY: repr(float(eps)), BN_MOMENTUM_KEY: repr(float(momentum))}


def _module_bn_settings(model: Any, where: str) -> tuple[float, float] | None:
    """``(eps, momentum)`` shared by every BatchNorm of a pickled model (stand-ins), ``None``
    without one; ConversionError when they differ (one file records one pair)."""
    found: set[tuple[float, float]] = set()

    def visit(module: Any) -> None:
        state = getattr(module, "__dict__", {})
        if getattr(module, "qualname", "").endswith(".BatchNorm2d"):
            eps, momentum = state.get("eps"), state.get("momentum")
            if isinstance(eps, float) and isinstance(momentum, float):
                found.add((eps, momentum))
        for child in (state.get("_modules") or {}).values():
            visit(child)

    visit(model)
    if len(found) > 1:
        raise ConversionError(
            f"{where}: its BatchNorms use {len(found)} different (eps, momentum) settings "
            f"({', '.join(map(str, sorted(found)[:3]))}); candle's models use one per file")
    return found.pop() if found else None


def convert_ultralytics(ckpt: Any, *, source: str, variant: str | None = None,
                        num_classes: int | None = None,
                        names: list[str] | None = None) -> Converted:
    """An unpickled ultralytics checkpoint (or a ``model.N.*`` state_dict) → candle names."""
    sd, ckpt_names, layers = _ultralytics_model(ckpt, source)
    sd, dropped = _drop_buffers(sd)
    module = _ultralytics_module(ckpt)
    yaml = module.__dict__.get("yaml") if module is not None else None
    version = _ultralytics_version(sd, layers, source,
                                   yaml.get("yaml_file") if isinstance(yaml, dict) else None)
    _check_ultralytics_kind(sd, source)
    if version == "11":  # candle has no YOLO11: ultralytics' names are ours
        tensors = {_model_n(k, source): v for k, v in sd.items()}
    else:
        classifier = any(k.startswith(f"model.{YOLO_CLS_HEAD_INDEX}.linear.") for k in sd)
        tensors = {_yolo_name(k, source, classifier): v for k, v in sd.items()}
    kpt = _kpt_shape(ckpt, layers[-1] if layers else None)
    if kpt is not None and len(kpt) == 2 and int(kpt[1]) != 3:
        raise ConversionError(
            f"{source}: keypoints of shape {tuple(kpt)} ((x, y) without visibility); candle's "
            "pose head needs (x, y, visibility) keypoints (kpt_shape [K, 3]): train with "
            "kpt_shape [K, 3]")
    spec = _yolo_spec(tensors, source)
    if spec.task == "pose" and kpt is None and (3 * spec.num_keypoints) % 2 == 0:
        raise ConversionError(
            f"{source}: a pose head of {3 * spec.num_keypoints} keypoint channels and no "
            f"kpt_shape in the file: {spec.num_keypoints} (x, y, visibility) or "
            f"{3 * spec.num_keypoints // 2} (x, y) keypoints? Convert the ultralytics .pt "
            "checkpoint (it records kpt_shape) rather than a bare state_dict")
    if variant is not None and variant != spec.variant:
        raise ConversionError(f"--variant {variant} given, but {source} holds {spec}")
    _check_count(spec.num_classes, num_classes, "classes")
    # names given by the caller are --names', and a wrong count is theirs; else the file's own
    where = "--names"
    if names is None and ckpt_names is not None:
        names, where = names_from(ckpt_names, source), source
    family = "yolo11" if isinstance(spec, Yolo11Spec) else "yolo_v8"
    model = family + {"pose": "_pose", "segment": "_seg", "classify": "_cls"}.get(spec.task, "")
    bn = _module_bn_settings(module, source) or (
        TORCH_BN if spec.task == "classify" else ULTRALYTICS_DETECT_BN)
    extra = _bn_metadata(*bn)
    imgsz = training_imgsz(ckpt, module, source)
    if imgsz is not None:
        extra[IMGSZ_KEY] = str(imgsz)
    preprocess = classify_preprocess(module, source) if spec.task == "classify" else None
    if preprocess is not None:
        extra[PREPROCESS_KEY] = preprocess.to_json()
    meta = WeightsMetadata(
        model=model, variant=spec.variant, task=TASKS[model], num_classes=spec.num_classes,
        num_keypoints=spec.num_keypoints if spec.task == "pose" else None,
        names=_check_names(names, spec.num_classes, where), source=source, extra=extra)
    return Converted(_numpy(tensors), meta, dropped=dropped)


_SUPPORTED = "only YOLOv8 and YOLO11 (detect, pose, segment, classify) models are supported"


def _model_n(key: str, where: str) -> str:
    """``key`` itself, checked to be an ultralytics ``model.N.*`` name (YOLO11's names)."""
    parts = key.split(".")
    if len(parts) < 3 or parts[0] != "model" or not parts[1].isdigit():
        raise ConversionError(f"{where}: tensor '{key}' is not an ultralytics 'model.N.*' name")
    return key


def _ultralytics_version(sd: Mapping[str, Any], layers: list[Any] | None, where: str,
                         yaml_file: str | None = None) -> str:
    """``"8"`` or ``"11"``: which YOLO a ``model.N.*`` state_dict holds, from its layer classes
    (``layers``: the pickled modules, when the file has them) or else its weights' names.
    ConversionError naming YOLOv5u, YOLO26 (``yaml_file``: the pickled model's yaml, which alone
    tells YOLO26-cls from YOLO11-cls) and other end-to-end models, whose layers are close but not
    the same."""
    kinds = {getattr(layer, "qualname", "").rsplit(".", 1)[-1] for layer in layers or ()}
    if "C3" in kinds or "model.2.cv3.conv.weight" in sd:
        raise ConversionError(
            f"{where} holds an ultralytics YOLOv5u model (C3 blocks); {_SUPPORTED}")
    attention = "C2PSA" in kinds or any(".attn.qkv." in k for k in sd)
    if attention and ("Classify" in kinds or any(".linear." in k for k in sd)):
        # yolo26-cls.yaml builds YOLO11-cls's layers; only the pickled model's yaml tells them
        # apart, and YOLO26's recipe is not one candle_nn reproduces
        if "yolo26" in str(yaml_file):
            raise ConversionError(
                f"{where} holds an ultralytics YOLO26 classification model ({yaml_file}); "
                f"{_SUPPORTED}")
        return "11"
    psa = "C2PSA" in kinds or "model.10.m.0.attn.qkv.conv.weight" in sd
    parts = [k.split(".") for k in sd]
    head = max((int(p[1]) for p in parts if len(p) > 1 and p[1].isdigit()), default=0)
    e2e = any(".one2one_" in k for k in sd)
    if psa and (e2e or f"model.{head}.dfl.conv.weight" not in sd):
        raise ConversionError(
            f"{where} holds an ultralytics YOLO26 model (end-to-end head without DFL); "
            f"{_SUPPORTED}")
    if e2e:
        raise ConversionError(
            f"{where} holds an ultralytics end-to-end model (its head has one2one_* branches, "
            f"as YOLOv10); {_SUPPORTED}")
    return "11" if psa else "8"


def _check_ultralytics_kind(sd: Mapping[str, Any], where: str) -> None:
    """ConversionError naming what a ``model.N.*`` state_dict is when it is no model this
    converter takes (its weights say so even without the model object): an OBB model, or a model
    whose BatchNorms were fused into its convs."""
    angles = [v for k, v in sd.items() if k.endswith(".cv4.0.2.weight") and k.count(".") == 5]
    if any(int(angle.shape[0]) == 1 for angle in angles):
        raise ConversionError(
            f"{where} holds an ultralytics OBB model (its head's cv4 predicts one rotation "
            f"angle); {_SUPPORTED}")
    if "model.0.conv.bias" in sd and "model.0.bn.weight" not in sd:
        raise ConversionError(f"{where} holds {FUSED_MODEL} (model.0.conv.bias, no model.0.bn.*)")


def _kpt_shape(ckpt: Any, head: Any) -> Any:
    """ultralytics' ``kpt_shape`` where the file records it (the Pose head, the model's yaml or
    the checkpoint's own dict); ``None`` when it does not."""
    places = [getattr(head, "__dict__", {})]
    model = ckpt.get("ema") or ckpt.get("model") if isinstance(ckpt, dict) else ckpt
    if isinstance(model, StandIn):
        places.append(model.__dict__.get("yaml"))
    if isinstance(ckpt, dict):
        places += [ckpt, ckpt.get("yaml"), ckpt.get("train_args")]
    for place in places:
        kpt = place.get("kpt_shape") if isinstance(place, dict) else None
        if kpt is not None:
            return kpt
    return None


def _yolo_spec(tensors: Mapping[str, Any], where: str) -> YoloV8Spec:
    """candle_nn_models.yolo_checkpoint.infer_spec on the converted names."""
    try:
        return infer_spec(_shapes_only(tensors))
    except CandleNNError as exc:
        raise ConversionError(f"{where}: {exc}") from exc


# -- MobileSAM -------------------------------------------------------------------------------------
def convert_mobile_sam(sd: Mapping[str, Any], *, source: str, variant: str | None = None,
                       num_classes: int | None = None,
                       names: list[str] | None = None) -> Converted:
    """MobileSAM's ``mobile_sam.pt`` state_dict → candle names (already identical)."""
    if variant not in (None, "tiny"):
        raise ConversionError(
            f"--variant {variant}: MobileSAM has only the 'tiny' (TinyViT-5M) variant")
    if num_classes is not None or names is not None:
        raise ConversionError("--num-classes/--names do not apply to MobileSAM")
    prefix, inner, outside = _strip_prefix(
        sd, ("image_encoder.patch_embed.seq.0.c.weight", "mask_decoder.iou_token.weight"),
        "MobileSAM (TinyViT)", source)
    inner, dropped = _drop_buffers(inner)
    converted = Converted(_numpy(inner), WeightsMetadata(
        model="mobile_sam", variant="tiny", task=TASKS["mobile_sam"], source=source,
        extra=_bn_metadata(*TORCH_BN)), dropped=dropped + outside)
    if prefix:
        converted.notes.append(f"stripped prefix '{prefix}'")
    return converted


# -- files ----------------------------------------------------------------------------------------
def convert(kind: str, src: "str | os.PathLike", *, variant: str | None = None,
            num_classes: int | None = None, names: list[str] | None = None) -> Converted:
    """Read ``src`` (unpickling it: opt-in) and convert it; checked against our model."""
    if kind not in SOURCES:
        raise ConversionError(f"unknown source format {kind!r}; use one of {', '.join(SOURCES)}")
    source = f"{kind}:{Path(src).name}"
    if kind == "ultralytics":
        converted = convert_ultralytics(load_ultralytics(src), source=source, variant=variant,
                                        num_classes=num_classes, names=names)
    else:
        fn = convert_mobile_sam if kind == "mobile_sam" else convert_resnet
        taken: list[tuple[str, list[str]]] = []
        sd = load_state_dict(src, ema_first=kind == "timm", taken=taken)
        converted = fn(sd, source=source, variant=variant, num_classes=num_classes, names=names)
        converted.notes[:0] = [_took(key, others, kind) for key, others in taken if others]
    check_against_model(converted)
    return converted


def _took(key: str, others: list[str], kind: str) -> str:
    """The note saying which of a checkpoint's state_dicts was converted, and why."""
    also = ", ".join(repr(k) for k in others)
    if key in EMA_KEYS:
        return (f"converted the EMA weights '{key}' (what timm loads by default); the file also "
                f"holds {also}")
    ema = [k for k in others if k in EMA_KEYS]
    hint = (" (EMA weights: --from timm converts those, as timm loads them)" if ema else "")
    return f"converted '{key}'; the file also holds {also}{hint}"


def check_against_model(converted: Converted) -> None:
    """ConversionError unless our model finds every tensor it reads, with the right shape."""
    from .inspection import compare

    meta = converted.metadata
    shapes = {k: tuple(v.shape) for k, v in converted.tensors.items()}
    try:
        match = compare(shapes, meta.model, meta.variant)
    except ModelUnavailableError as exc:
        converted.notes.append(f"not checked against the model: {exc}")
        return
    if match.fits:
        if match.unused:
            converted.notes.append(f"{len(match.unused)} tensors kept that the model does not read")
        return
    problems = []
    if match.missing:
        more = " …" if len(match.missing) > 6 else ""
        problems.append(f"missing {', '.join(match.missing[:6])}{more}")
    problems += [f"{n} is {list(got)}, expected {list(want)}"
                 for n, got, want in match.mismatched[:4]]
    if match.extra:
        more = " …" if len(match.extra) > 6 else ""
        n = len(match.extra)
        problems.append(f"{n} tensor{'s' if n > 1 else ''} it does not read "
                        f"({', '.join(match.extra[:6])}{more}): another variant?")
    raise ConversionError(
        f"{meta.source} converted to candle names does not fit {match.label()}: "
        + "; ".join(problems))


def check_output(out: "str | os.PathLike") -> Path:
    """``out`` as a Path when a file can be written there (checked before converting);
    WeightsFileError saying why not (a folder, a missing or read-only parent folder)."""
    out = Path(out)
    parent = out.parent
    if out.is_dir():
        raise WeightsFileError(f"output {out} is a directory; pass a .safetensors file path")
    if not parent.is_dir():
        what = "does not exist" if not parent.exists() else "is not a folder"
        raise WeightsFileError(f"cannot write {out}: the folder {parent} {what}")
    effective = os.access in os.supports_effective_ids
    if not os.access(parent, os.W_OK | os.X_OK, effective_ids=effective):
        raise WeightsFileError(f"cannot write {out}: the folder {parent} is not writable "
                               "(permission denied)")
    return out


def save(converted: Converted, out: "str | os.PathLike") -> Path:
    """Write the safetensors file atomically (complete or absent). bfloat16 arrives widened to
    float32 (NumPy, which writes the file, has no bfloat16)."""
    from safetensors.numpy import save_file

    out = check_output(out)
    try:
        with atomic_write(out) as tmp:
            save_file({k: np.ascontiguousarray(v) for k, v in converted.tensors.items()},
                      str(tmp), metadata=converted.metadata.to_dict())
    except OSError as exc:
        raise WeightsFileError(f"cannot write {out}: {exc.strerror or exc}") from exc
    except Exception as exc:  # safetensors' Rust errors (disk full, I/O) are no OSError
        raise WeightsFileError(f"cannot write {out}: {_first_line(exc)}") from exc
    return out


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
