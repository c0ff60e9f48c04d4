"""A model whose variant does not fit the file is refused, for every model and part: the
VarBuilder records what the model read, and a ``load`` refuses a file that holds tensors under
the model's prefix it did not read (``VarBuilder.check_all_read``). The tensors a model knowingly
leaves (a headless ResNet's ``fc``, a pose file's keypoint branch read as a detector, TinyViT's
ImageNet head in MobileSAM's files) still load.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import fixture_dir

import candle_nn as cn
from candle_nn_models.resnet import ResNet
from candle_nn_models.segment_anything import ImageEncoderViT, MaskDecoder, Sam, ViTConfig
from candle_nn_models.segment_anything.prompt_encoder import PromptEncoder
from candle_nn_models.weights.spec import RecordingSource, build_model, expected_tensors
from candle_nn_models.yolo_v8 import YoloV8, YoloV8Pose


def zeros_file(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """A fake checkpoint: BatchNorm variances 1 (folding divides by them), the rest zeros."""
    return {k: (np.ones if k.endswith("running_var") else np.zeros)(s, np.float32)
            for k, s in shapes.items()}


def vb_of(tensors) -> cn.VarBuilder:
    return cn.VarBuilder.from_tensors(tensors)


@pytest.mark.parametrize("stored,wanted", [("resnet34", "resnet18"), ("resnet101", "resnet50")])
def test_resnet_of_another_depth_is_refused(stored, wanted):
    tensors = zeros_file(expected_tensors("resnet", stored))
    with pytest.raises(cn.ShapeMismatchError, match=f"does not read.*holds {stored}"):
        ResNet.load(vb_of(tensors), wanted)
    with pytest.raises(cn.ShapeMismatchError, match=f"{wanted} does not read"):
        build_model("resnet", wanted, vb_of(tensors))
    assert ResNet.load(vb_of(tensors), stored).variant == stored


def test_headless_resnet_from_a_classifier_file_still_loads():
    tensors = zeros_file(expected_tensors("resnet", "resnet18"))
    assert ResNet.load(vb_of(tensors), "resnet18", num_classes=None).num_classes is None


def test_resnet_fixture_loads_and_a_stray_tensor_is_refused():
    path = fixture_dir("resnet18") / "weights.safetensors"
    ResNet.load(cn.VarBuilder.from_safetensors(path), "resnet18")
    tensors = dict(mx.load(str(path)))
    tensors["layer4.2.conv1.weight"] = mx.zeros((512, 512, 3, 3))
    with pytest.raises(cn.ShapeMismatchError, match=r"1 tensor resnet18 does not read "
                                                    r"\(layer4\.2\.conv1\.weight\)"):
        ResNet.load(vb_of(tensors), "resnet18")


def test_yolo_extra_tensors_are_refused_and_a_pose_file_loads_as_its_detector():
    path = fixture_dir("yolov8n_pose") / "weights.safetensors"
    pose = dict(mx.load(str(path)))
    YoloV8.load(vb_of(pose), "n", num_classes=1)  # the keypoint branch is knowingly unread
    YoloV8Pose.load(vb_of(pose), "n", 17, 1)
    det = dict(mx.load(str(fixture_dir("yolov8n") / "weights.safetensors")))
    for name in ("net.b3.1.bottleneck.5.cv1.conv.weight", "fpn.n1.bottleneck.5.cv1.conv.weight",
                 "head.cv3.3.0.conv.weight"):
        stray = {**det, name: mx.zeros((8, 8, 3, 3))}
        with pytest.raises(cn.ShapeMismatchError, match="does not read"):
            YoloV8.load(vb_of(stray), "n", 80)
    stray = {**pose, "head.cv4.3.0.conv.weight": mx.zeros((8, 8, 3, 3))}
    with pytest.raises(cn.ShapeMismatchError, match="pose head.*does not read"):
        YoloV8Pose.load(vb_of(stray), "n", 17, 1)


def _recorded(load) -> dict[str, np.ndarray]:
    source = RecordingSource()
    load(cn.VarBuilder(source, dtype=mx.float32, device=cn.Device.cpu()))
    return zeros_file(source.requested)


SMALL_VIT = dict(embed_dim=32, num_heads=2, img_size=64, patch_size=16, window_size=2,
                 out_chans=16)


def test_sam_parts_of_another_size_are_refused():
    deep = ViTConfig(depth=3, global_attn_indexes=(0,), **SMALL_VIT)
    shallow = ViTConfig(depth=2, global_attn_indexes=(0,), **SMALL_VIT)
    tensors = _recorded(lambda vb: ImageEncoderViT.load(vb, deep))
    with pytest.raises(cn.ShapeMismatchError, match=r"SAM ViT encoder.*does not read \(blocks\.2"):
        ImageEncoderViT.load(vb_of(tensors), shallow)
    for part, load in (("prompt encoder", lambda vb: PromptEncoder.load(vb, 256)),
                       ("mask decoder", lambda vb: MaskDecoder.load(vb))):
        tensors = _recorded(load)
        load(vb_of(tensors))
        tensors["extra.weight"] = np.zeros(3, np.float32)
        with pytest.raises(cn.ShapeMismatchError, match=f"{part}.*does not read"):
            load(vb_of(tensors))


def test_mobile_sam_fixture_loads_and_stray_tensors_are_refused():
    path = fixture_dir("mobile_sam") / "weights.safetensors"
    tensors = dict(mx.load(str(path)))
    Sam.load(vb_of(tensors))  # TinyViT's ImageNet head in the file is knowingly unread
    for name in ("image_encoder.layers.4.blocks.0.mlp.fc1.weight", "something_else.weight"):
        with pytest.raises(cn.ShapeMismatchError, match="does not read"):
            Sam.load(vb_of({**tensors, name: mx.zeros((4, 4))}))


def test_inspect_applies_the_same_rule():
    """``inspect`` and ``convert`` compare through the same declaration: a ResNet-34 file no longer
    'fits' resnet18; the files the models knowingly leave tensors of still fit."""
    from candle_nn_models.weights.inspection import compare

    r34 = expected_tensors("resnet", "resnet34")
    assert not compare(r34, "resnet", "resnet18").fits
    assert compare(r34, "resnet", "resnet34").fits
    counted = {**r34, "bn1.num_batches_tracked": ()}
    assert compare(counted, "resnet", "resnet34").unused == ["bn1.num_batches_tracked"]
    sam = {k: tuple(v.shape) for k, v in
           mx.load(str(fixture_dir("mobile_sam") / "weights.safetensors")).items()}
    match = compare(sam, "mobile_sam", "tiny")
    assert match.fits and len(match.unused) == 4
    pose = {k: tuple(v.shape) for k, v in
            mx.load(str(fixture_dir("yolov8n_pose") / "weights.safetensors")).items()}
    assert compare(pose, "yolo_v8", "n").fits  # its detector
    pose["head.cv4.3.0.conv.weight"] = (8, 8, 3, 3)
    assert not compare(pose, "yolo_v8_pose", "n").fits
