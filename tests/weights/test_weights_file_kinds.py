"""What a weights file is: a PyTorch checkpoint given where safetensors are expected is named as
such with the exact convert command; a SAM file's encoder is read from the file."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch  # the `test` extra
from conftest import FIXTURES, fixture_dir, one_error_line

import candle_nn as cn
from helpers.weights_fakes import save_ultralytics, ultralytics_checkpoint
from candle_nn_models.segment_anything import Sam, infer_encoder
from candle_nn_models.weights.spec import RecordingSource

BIKE = str(FIXTURES / "images" / "bike.jpg")


def test_a_pytorch_checkpoint_is_named_with_the_convert_command(tmp_path, capsys):
    from candle_nn_models.scripts.resnet import main

    best = tmp_path / "best.pt"
    torch.save({"conv1.weight": torch.zeros(1), "layer1.0.conv1.weight": torch.zeros(1)}, best)
    want = (f"{best} is a PyTorch checkpoint, not a safetensors file: convert it first with "
            f"`candle-nn-weights convert --from torchvision {best} best.safetensors`")
    with pytest.raises(cn.WeightsFileError, match="convert it first") as err:
        cn.VarBuilder.from_safetensors(best)
    assert want in str(err.value) and "truncated or corrupt" not in str(err.value)
    assert main(["--image", BIKE, "--weights", str(best)]) == 1
    assert want in one_error_line(capsys)
    legacy = tmp_path / "legacy.pth"
    torch.save({"a": torch.zeros(1)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(cn.WeightsFileError,
                       match=r"--from torchvision\|timm\|ultralytics\|mobile_sam"):
        cn.VarBuilder.from_safetensors(legacy)
    ultra = tmp_path / "yolo.pt"
    save_ultralytics(ultra, lambda f: ultralytics_checkpoint(
        {"model.0.conv.weight": np.zeros((16, 3, 3, 3), np.float32)}, pose=False,
        names={0: "a"}, factory=f))
    with pytest.raises(cn.WeightsFileError, match=f"--from ultralytics {ultra} yolo.safetensors"):
        cn.VarBuilder.from_safetensors(ultra)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"PK\x03\x04 not a zip at all")
    with pytest.raises(cn.WeightsFileError, match="truncated or corrupt"):
        cn.VarBuilder.from_safetensors(junk)


def _shapes_of(encoder: str) -> cn.VarBuilder:
    """A VarBuilder holding (zero-stride, never materialised) tensors of a SAM checkpoint."""
    source = RecordingSource()
    Sam.load(cn.VarBuilder(source, dtype=mx.float32, device=cn.Device.cpu()), encoder)
    zero = np.zeros((), np.float32)
    return cn.VarBuilder.from_tensors({k: np.broadcast_to(zero, s)
                                       for k, s in source.requested.items()})


def test_sam_encoder_is_inferred_from_the_file():
    mobile = cn.VarBuilder.from_safetensors(fixture_dir("mobile_sam") / "weights.safetensors")
    assert infer_encoder(mobile) == "tiny"
    for variant in ("vit_b", "vit_l"):
        assert infer_encoder(_shapes_of(variant)) == variant
    with pytest.raises(cn.WeightsFileError, match="holds no SAM image encoder"):
        infer_encoder(cn.VarBuilder.from_tensors({"x": np.zeros(1)}))


def test_sam_load_of_another_encoder_names_the_files_encoder():
    vit_b = _shapes_of("vit_b")
    with pytest.raises(cn.ShapeMismatchError, match=r"hold SAM with the vit_b encoder, not tiny"
                                                    r".*--model vit_b"):
        Sam.load(vit_b, "tiny")
    mobile = cn.VarBuilder.from_safetensors(fixture_dir("mobile_sam") / "weights.safetensors")
    with pytest.raises(cn.ShapeMismatchError, match="the tiny encoder, not vit_h"):
        Sam.load(mobile, "vit_h")
