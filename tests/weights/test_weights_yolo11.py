"""``candle-nn-weights convert --from ultralytics`` on YOLO11 files (ultralytics' models built from
their YAML, no download): the version is read from the layers, ultralytics' names are kept, and
the neighbours it is not — YOLOv5u, YOLO26, OBB — are each one error naming them, whether the
file holds the pickled model or only its state_dict; YOLO11-cls converts and loads."""

from __future__ import annotations

import pytest
import torch

from conftest import one_error_line
from helpers.ultralytics_reference import import_ultralytics
from candle_nn_models.weights.cli import main
from candle_nn_models.weights.metadata import read_metadata
from candle_nn_models.weights.spec import expected_tensors


def _model(kind: str, yaml: str, **kwargs) -> torch.nn.Module:
    import_ultralytics()
    from ultralytics.nn import tasks

    torch.manual_seed(0)
    return getattr(tasks, kind)(yaml, verbose=False, **kwargs)


@pytest.mark.parametrize("as_state_dict", [False, True])
def test_yolo11_pose_keeps_ultralytics_names(tmp_path, capsys, as_state_dict):
    model = _model("PoseModel", "yolo11n-pose.yaml", nc=1)
    model.names = {0: "person"}
    src, out = tmp_path / "best.pt", tmp_path / "best.safetensors"
    torch.save(model.state_dict() if as_state_dict else {"model": model}, src)
    assert main(["convert", "--from", "ultralytics", str(src), str(out)]) == 0
    meta = read_metadata(out)
    assert (meta.model, meta.variant, meta.num_keypoints) == ("yolo11_pose", "n", 17)
    assert meta.names == (None if as_state_dict else ["person"])
    assert "yolo11_pose n" in capsys.readouterr().out
    assert main(["inspect", str(out)]) == 0
    assert "yolo11_pose n" in capsys.readouterr().out
    want = expected_tensors("yolo11_pose", "n", num_classes=1)
    from safetensors import safe_open

    with safe_open(str(out), "numpy") as f:
        assert {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()} == want


@pytest.mark.parametrize("as_state_dict", [False, True])
def test_yolo11_seg_converts(tmp_path, as_state_dict):
    model = _model("SegmentationModel", "yolo11s-seg.yaml", nc=2)
    src, out = tmp_path / "best.pt", tmp_path / "best.safetensors"
    torch.save(model.state_dict() if as_state_dict else {"model": model}, src)
    assert main(["convert", "--from", "ultralytics", str(src), str(out), "--variant", "s"]) == 0
    meta = read_metadata(out)
    assert (meta.model, meta.variant, meta.task, meta.num_classes) == ("yolo11_seg", "s",
                                                                       "segment", 2)


@pytest.mark.parametrize("kind, yaml, fragment", [
    ("DetectionModel", "yolov5nu.yaml", "YOLOv5u model"),
    ("DetectionModel", "yolo26n.yaml", "YOLO26 model"),
    ("OBBModel", "yolo11n-obb.yaml", "OBB"),
])
@pytest.mark.parametrize("as_state_dict", [False, True])
def test_unsupported_neighbours_are_named(tmp_path, capsys, kind, yaml, fragment, as_state_dict):
    model = _model(kind, yaml)
    src, out = tmp_path / "best.pt", tmp_path / "best.safetensors"
    torch.save(model.state_dict() if as_state_dict else {"model": model}, src)
    capsys.readouterr()  # what building the model logged
    assert main(["convert", "--from", "ultralytics", str(src), str(out)]) == 1
    assert fragment in one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("as_state_dict", [False, True])
def test_yolo11_cls_converts_and_loads(tmp_path, as_state_dict):
    import candle_nn as cn

    from candle_nn_models.yolo_checkpoint import load_model
    from candle_nn_models.yolo11 import Yolo11Cls

    model = _model("ClassificationModel", "yolo11s-cls.yaml", nc=7)
    src, out = tmp_path / "best.pt", tmp_path / "best.safetensors"
    torch.save(model.state_dict() if as_state_dict else {"model": model}, src)
    assert main(["convert", "--from", "ultralytics", str(src), str(out)]) == 0
    meta = read_metadata(out)
    assert (meta.model, meta.variant, meta.task, meta.num_classes) == ("yolo11_cls", "s",
                                                                       "classify", 7)
    loaded = load_model(cn.VarBuilder.from_safetensors(str(out)))
    assert isinstance(loaded, Yolo11Cls) and str(loaded.variant) == "s"
