"""ultralytics files as older releases and other save paths wrote them: segment and pose heads of
ultralytics 8.0-8.3 hold ``self.detect = Detect.forward``, which torch.save's pickle protocol 2
writes as ``builtins.getattr(Detect, "forward")``; that exact form converts, and nothing wider —
a whole model pickled after ``fuse()`` (bound ``forward_fuse`` methods) is named as fused."""

from __future__ import annotations

import io
import pickletools
import zipfile

import numpy as np
import pytest
import torch
from conftest import one_error_line
from safetensors.numpy import load_file

from helpers.ultralytics_models import seeded
from helpers.ultralytics_reference import import_ultralytics
from candle_nn_models.weights.cli import main
from candle_nn_models.weights.metadata import read_metadata


def _globals(path) -> set[str]:
    """The ``module name`` globals the zip's data.pkl names (GLOBAL opcodes, protocol 2)."""
    with zipfile.ZipFile(path) as zf:
        data = zf.read(next(n for n in zf.namelist() if n.endswith("data.pkl")))
    return {str(arg) for op, arg, _ in pickletools.genops(io.BytesIO(data))
            if op.name == "GLOBAL"}


@pytest.mark.parametrize("kind, yaml, model", [
    ("SegmentationModel", "yolov8n-seg.yaml", "yolo_v8_seg"),
    ("PoseModel", "yolov8n-pose.yaml", "yolo_v8_pose"),
    ("SegmentationModel", "yolo11n-seg.yaml", "yolo11_seg"),
])
def test_heads_of_ultralytics_8_0_to_8_3_convert(tmp_path, capsys, kind, yaml, model):
    ref = seeded(kind, yaml)
    from ultralytics.nn.modules.head import Detect

    ref.model[-1].detect = Detect.forward  # what Segment/Pose.__init__ set in 8.0-8.3
    src, out = tmp_path / "old.pt", tmp_path / "old.safetensors"
    torch.save({"model": ref.half(), "ema": None}, src, pickle_protocol=2)
    assert "__builtin__ getattr" in _globals(src)
    assert main(["convert", "--from", "ultralytics", str(src), str(out)]) == 0, \
        capsys.readouterr().err
    assert read_metadata(out).model == model
    tensors = load_file(out)
    state = {k: v for k, v in ref.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert len(tensors) == len(state)
    assert sorted(np.abs(v).sum() for v in tensors.values()) == pytest.approx(
        sorted(float(v.float().abs().sum()) for v in state.values()), rel=1e-3)


@pytest.mark.parametrize("name", ["__subclasses__", "__setstate__", "fuse"])
def test_other_getattr_targets_are_still_refused(tmp_path, capsys, name):
    import_ultralytics()
    from ultralytics.nn.modules.head import Detect

    class Sneaky:
        def __reduce__(self):
            return (getattr, (Detect, name))

    src = tmp_path / "evil.pt"
    torch.save({"model": None, "ema": Sneaky()}, src, pickle_protocol=2)
    assert main(["convert", "--from", "ultralytics", str(src),
                 str(tmp_path / "o.safetensors")]) == 1
    assert f"refusing to read getattr(ultralytics.nn.modules.head.Detect, '{name}')" in \
        one_error_line(capsys)


def test_a_model_pickled_after_fuse_is_named_as_fused(tmp_path, capsys):
    ref = seeded("DetectionModel", "yolov8n.yaml").fuse(verbose=False)
    src = tmp_path / "fused.pt"
    torch.save({"model": ref}, src)
    capsys.readouterr()
    assert main(["convert", "--from", "ultralytics", str(src),
                 str(tmp_path / "o.safetensors")]) == 1
    line = one_error_line(capsys, "fused ultralytics model")
    assert "getattr" not in line
    assert not (tmp_path / "o.safetensors").exists()
