"""`candle-nn-weights inspect`: the shared fixtures are recognised; wrong files are explained."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import load_fixture, one_error_line
from candle_nn_models.weights.cli import main
from candle_nn_models.weights.inspection import inspect_file
from candle_nn_models.weights.metadata import WeightsMetadata

FIXTURE_MODELS = {
    "resnet18": ("resnet", "resnet18", {"num_classes": 1000}),
    "yolov8n": ("yolo_v8", "n", {"num_classes": 80}),
    "yolov8n_pose": ("yolo_v8_pose", "n", {"num_keypoints": 17, "num_classes": 1}),
    "mobile_sam": ("mobile_sam", "tiny", {}),
}


def _weights(name: str):
    return load_fixture(name)[2] / "weights.safetensors"


@pytest.mark.parametrize("fixture", list(FIXTURE_MODELS))
def test_fixture_weights_are_detected(fixture):
    report = inspect_file(_weights(fixture))
    model, variant, counts = FIXTURE_MODELS[fixture]
    best = report.best
    assert (best.model, best.variant, best.counts) == (model, variant, counts)
    assert best.fits and not report.unavailable
    assert report.total_bytes == sum(np.prod(t.shape) * 2 for t in report.tensors.values())


def test_cli_lists_tensors_and_the_fit(capsys):
    assert main(["inspect", str(_weights("yolov8n"))]) == 0
    out = capsys.readouterr().out
    assert "298 tensors" in out and "dtypes: F16 x298" in out
    assert "net.b1.0.conv.weight" in out and "[16, 3, 3, 3]" in out
    assert "fits: yolo_v8 n (80 classes): all 298 tensors" in out


def test_mobile_sam_fit_reports_the_unused_classifier_head(capsys):
    assert main(["inspect", "--summary", str(_weights("mobile_sam"))]) == 0
    out = capsys.readouterr().out
    assert "fits: mobile_sam tiny: all 408 tensors; 4 extra tensors not used" in out
    assert "image_encoder.head.weight" in out


def test_wrong_model_says_what_it_looks_like_and_what_is_missing(capsys):
    rc = main(["inspect", "--summary", "--model", "yolo_v8_pose", str(_weights("yolov8n"))])
    out = capsys.readouterr().out
    assert rc == 1
    assert "does not fit yolo_v8_pose" in out
    assert "missing (36): head.cv4.0.0.conv.weight" in out
    assert "it looks like: yolo_v8 n (80 classes) (fits)" in out


def test_wrong_variant_lists_shape_mismatches(capsys):
    rc = main(["inspect", "--summary", "--model", "yolo_v8", "--variant", "s",
               str(_weights("yolov8n"))])
    out = capsys.readouterr().out
    assert rc == 1
    assert ("shape mismatch: net.b1.0.conv.weight is [16, 3, 3, 3], "
            "the model expects [32, 3, 3, 3]") in out
    assert "it looks like: yolo_v8 n (80 classes) (fits)" in out


def test_incomplete_file_names_the_closest_model_and_missing_tensors(tmp_path, capsys):
    tensors = load_file(_weights("resnet18"))
    del tensors["layer4.1.conv2.weight"], tensors["fc.bias"]
    path = tmp_path / "partial.safetensors"
    save_file(tensors, str(path), metadata=WeightsMetadata(model="resnet").to_dict())
    assert main(["inspect", "--summary", str(path)]) == 1
    out = capsys.readouterr().out
    assert "metadata candle_nn.model = resnet" in out
    assert "Closest: resnet resnet18 (1000 classes), 100/102 tensors match" in out
    assert "missing (2): layer4.1.conv2.weight, fc.bias" in out


def test_corrupt_missing_and_pickle_files_give_one_error(tmp_path, capsys):
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(_weights("yolov8n").read_bytes()[:5000])
    assert main(["inspect", str(truncated)]) == 1
    assert "not a valid safetensors file" in one_error_line(capsys)
    assert main(["inspect", str(tmp_path / "none.safetensors")]) == 1
    assert "not found" in one_error_line(capsys)
    pt = tmp_path / "model.pt"
    pt.write_bytes(b"PK")
    assert main(["inspect", str(pt)]) == 1
    assert "candle-nn-weights convert" in one_error_line(capsys)
    assert main(["inspect", "--model", "yolo_v8", "--variant", "q", str(truncated)]) == 1
    assert "unknown variant 'q'" in one_error_line(capsys)
