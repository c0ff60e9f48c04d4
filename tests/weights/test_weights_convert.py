"""torchvision/timm ResNet and MobileSAM state_dicts → candle safetensors."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch  # the `test` extra
from safetensors.numpy import load_file, save_file

import candle_nn as cn
from conftest import load_fixture, one_error_line
from helpers.weights_fakes import random_candle_tensors
from candle_nn_models.weights.cli import main
from candle_nn_models.weights.metadata import read_metadata
from candle_nn_models.weights.spec import expected_tensors


def _fixture(name: str) -> dict[str, np.ndarray]:
    return load_file(load_fixture(name)[2] / "weights.safetensors")


def _torch_sd(tensors, prefix: str = "", batches_tracked: bool = True) -> dict:
    """A state_dict as torch saves it: prefixed names, num_batches_tracked after each BN."""
    sd = {}
    for name, value in tensors.items():
        sd[prefix + name] = torch.from_numpy(np.ascontiguousarray(value))
        if batches_tracked and name.endswith("running_var"):
            sd[prefix + name[: -len("running_var")] + "num_batches_tracked"] = torch.tensor(5)
    return sd


@pytest.mark.parametrize("kind, wrap", [
    ("torchvision", lambda sd: sd),
    ("timm", lambda sd: {"epoch": 3, "arch": "resnet18", "state_dict": sd}),
])
def test_resnet18_state_dict_converts_to_the_fixture_tensors(tmp_path, kind, wrap):
    candle = _fixture("resnet18")
    src, out = tmp_path / "r18.pth", tmp_path / "r18.safetensors"
    torch.save(wrap(_torch_sd(candle, prefix="module.")), src)
    assert main(["convert", "--from", kind, str(src), str(out)]) == 0
    converted = load_file(out)
    assert converted.keys() == candle.keys()
    for name, value in candle.items():
        np.testing.assert_array_equal(converted[name], value, err_msg=name)
    info = read_metadata(out)
    assert (info.model, info.variant, info.task, info.num_classes) == (
        "resnet", "resnet18", "classify", 1000)
    assert info.source == f"{kind}:r18.pth"


@pytest.fixture(scope="module")
def resnet18_10_classes():
    return random_candle_tensors(expected_tensors("resnet", "resnet18", num_classes=10), seed=18)


def test_prefixed_non_1000_head_converts_and_matches_the_candle_named_forward(
        tmp_path, resnet18_10_classes):
    from candle_nn_models.resnet import ResNet

    candle = resnet18_10_classes
    src, out, ref = (tmp_path / n for n in ("bb.pt", "bb.safetensors", "ref.safetensors"))
    sd = _torch_sd(candle, prefix="backbone.")
    sd["neck.proj.weight"] = torch.zeros(3, 3)  # outside the prefix: ignored
    torch.save(sd, src)
    names = tmp_path / "labels.txt"
    names.write_text("\n".join(f"label {i}" for i in range(10)) + "\n")
    assert main(["convert", "--from", "torchvision", str(src), str(out), "--names", str(names),
                 "--variant", "resnet18", "--num-classes", "10"]) == 0
    info = read_metadata(out)
    assert info.num_classes == 10 and info.names == [f"label {i}" for i in range(10)]
    assert load_file(out).keys() == candle.keys()
    save_file(candle, str(ref))
    x = mx.random.uniform(shape=(1, 64, 64, 3), key=mx.random.key(1))
    logits = [np.array(ResNet.load(cn.VarBuilder.from_safetensors(p, device="cpu"),
                                   "resnet18", 10)(x)) for p in (out, ref)]
    assert logits[0].shape == (1, 10)
    np.testing.assert_array_equal(logits[0], logits[1])


def test_headless_backbone_converts_and_inspects_as_headless(tmp_path, capsys):
    from candle_nn_models.resnet import ResNet

    candle = {k: v for k, v in _fixture("resnet18").items() if not k.startswith("fc.")}
    src, out = tmp_path / "backbone.pth", tmp_path / "backbone.safetensors"
    torch.save({"model": _torch_sd(candle, prefix="encoder.")}, src)
    assert main(["convert", "--from", "timm", str(src), str(out)]) == 0
    assert read_metadata(out).num_classes is None
    features = ResNet.load(cn.VarBuilder.from_safetensors(out, device="cpu"), "resnet18", None)(
        mx.zeros((1, 32, 32, 3)))
    assert features.shape == (1, 512)
    capsys.readouterr()
    assert main(["inspect", "--summary", str(out)]) == 0
    assert "fits: resnet resnet18 (headless): all 100 tensors" in capsys.readouterr().out


def test_safetensors_source_needs_no_pickle(tmp_path):
    candle = _fixture("resnet18")
    src, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({"model." + k: v for k, v in candle.items()}, str(src))
    assert main(["convert", "--from", "timm", str(src), str(out)]) == 0
    assert load_file(out).keys() == candle.keys()


def test_resnet_option_mismatches_and_unknown_depths_fail(tmp_path, capsys):
    candle = _fixture("resnet18")
    src, out = tmp_path / "r.pt", tmp_path / "r.safetensors"
    torch.save(_torch_sd(candle), src)
    assert main(["convert", "--from", "torchvision", str(src), str(out), "--variant",
                 "resnet50"]) == 1
    assert "holds a resnet18" in one_error_line(capsys)
    assert main(["convert", "--from", "torchvision", str(src), str(out), "--num-classes",
                 "10"]) == 1
    assert "1000 classes" in one_error_line(capsys)
    torch.save(_torch_sd({k: v for k, v in candle.items() if not k.startswith("layer4.1.")}), src)
    assert main(["convert", "--from", "torchvision", str(src), str(out)]) == 1
    assert "none of resnet18/34/50/101/152" in one_error_line(capsys)
    assert not out.exists()


class Payload:
    """Not a tensor: torch's weights-only reader must refuse it."""


def test_names_option_is_checked_and_output_never_overwrites_the_source(tmp_path, capsys):
    candle = _fixture("resnet18")
    src = tmp_path / "r.safetensors"
    save_file(candle, str(src))
    names = tmp_path / "names.json"
    names.write_text('["a", "b"]')
    assert main(["convert", "--from", "torchvision", str(src), str(tmp_path / "o.safetensors"),
                 "--names", str(names)]) == 1
    assert "2 class names from --names for a head of 1000 classes" in one_error_line(capsys)
    assert main(["convert", "--from", "torchvision", str(src), str(src)]) == 1
    assert "OUT is the source checkpoint" in one_error_line(capsys)
    assert main(["convert", "--from", "torchvision", str(src), str(tmp_path / "o.safetensors"),
                 "--names", str(tmp_path / "none.txt")]) == 1
    assert "cannot read class names" in one_error_line(capsys)


def test_state_dict_with_unexpected_objects_is_refused(tmp_path, capsys):
    src = tmp_path / "odd.pt"
    torch.save({"conv1.weight": torch.zeros(1), "extra": Payload()}, src)
    assert main(["convert", "--from", "timm", str(src), str(tmp_path / "o.safetensors")]) == 1
    assert "Payload" in one_error_line(capsys)


def test_unknown_source_format_and_missing_file(tmp_path, capsys):
    with pytest.raises(SystemExit):  # argparse: choices
        main(["convert", "--from", "keras", "a", "b"])
    capsys.readouterr()
    assert main(["convert", "--from", "mobile_sam", str(tmp_path / "none.pt"), "o"]) == 1
    assert "checkpoint not found" in one_error_line(capsys)


def test_mobile_sam_state_dict_drops_index_buffers_and_keeps_candle_names(tmp_path):
    candle = _fixture("mobile_sam")
    sd = _torch_sd(candle)
    for name in candle:
        if name.endswith("attention_biases"):  # MobileSAM's index buffer next to each bias table
            sd[name.replace("attention_biases", "attention_bias_idxs")] = torch.zeros(
                49, 49, dtype=torch.int64)
    src, out = tmp_path / "mobile_sam.pt", tmp_path / "mobile_sam.safetensors"
    torch.save(sd, src)
    assert main(["convert", "--from", "mobile_sam", str(src), str(out)]) == 0
    converted = load_file(out)
    assert converted.keys() == candle.keys()
    for name, value in candle.items():
        np.testing.assert_array_equal(converted[name], value, err_msg=name)
    info = read_metadata(out)
    assert (info.model, info.variant, info.task) == ("mobile_sam", "tiny", "segment")


def test_mobile_sam_with_missing_tensors_fails_with_their_names(tmp_path, capsys):
    candle = _fixture("mobile_sam")
    sd = _torch_sd({k: v for k, v in candle.items() if "iou_prediction_head" not in k})
    src = tmp_path / "partial.pt"
    torch.save(sd, src)
    assert main(["convert", "--from", "mobile_sam", str(src), str(tmp_path / "o.safetensors")]) == 1
    line = one_error_line(capsys)
    assert "does not fit mobile_sam tiny" in line and "iou_prediction_head" in line
