"""Reading a model's output: postprocess refuses a class/keypoint count that does not account
for the prediction's channels; a one-logit classifier's probability is its sigmoid."""

from __future__ import annotations

import re

import mlx.core as mx
import numpy as np
import pytest
from conftest import FIXTURES
from PIL import Image

import candle_nn as cn
from candle_nn_models.imagenet import preprocess
from candle_nn_models.letterbox import Letterbox
from candle_nn_models.resnet import ResNet, class_probabilities
from candle_nn_models.yolo_v8_post import postprocess


def test_postprocess_refuses_a_class_count_that_is_not_the_models():
    lb = Letterbox(np.zeros((64, 64, 3), np.uint8), 1.0, (0, 0), (64, 64))
    pred = np.random.default_rng(0).uniform(0, 1, (1, 84, 10)).astype(np.float32)
    with pytest.raises(cn.ShapeMismatchError, match="84 channels, not 4 \\+ 2 classes = 6"):
        postprocess(pred, [lb], num_classes=2)
    with pytest.raises(cn.ShapeMismatchError, match="not 4 \\+ 1 classes \\+ 3 x 17 keypoints"):
        postprocess(pred, [lb], num_classes=1, num_keypoints=17)
    assert all(d.keypoints is None for d in postprocess(pred, [lb], num_classes=80)[0])
    pose = np.random.default_rng(1).uniform(0, 1, (1, 56, 10)).astype(np.float32)
    dets = postprocess(pose, [lb], num_classes=1, num_keypoints=17, conf=0.0)[0]
    assert dets and all(d.keypoints.shape == (17, 3) for d in dets)


def test_one_logit_head_gives_its_sigmoid_not_100_percent(tmp_path, capsys):
    logits = mx.array([[2.0], [-1.0]])
    np.testing.assert_allclose(np.array(class_probabilities(logits)),
                               1 / (1 + np.exp(-np.array([[2.0], [-1.0]]))), rtol=1e-6)
    many = mx.array([[1.0, 2.0, 3.0]])
    np.testing.assert_allclose(np.array(class_probabilities(many)).sum(), 1.0, rtol=1e-6)

    from candle_nn_models.scripts.resnet import main

    model = ResNet.load(cn.VarBuilder.from_varmap(cn.VarMap(), seed=3), "resnet18",
                        num_classes=1)
    path = tmp_path / "binary.safetensors"
    cn.save_safetensors(model, path)
    image = str(FIXTURES / "images" / "bike.jpg")
    assert main(["--image", image, "--weights", str(path)]) == 0
    (percent,) = re.findall(r": ([0-9.]+)%", capsys.readouterr().out)
    rgb = np.asarray(Image.open(image).convert("RGB"))
    logit = float(np.array(model(mx.array(preprocess(rgb)[None])))[0, 0])
    assert float(percent) == pytest.approx(100 / (1 + np.exp(-logit)), abs=0.01)
    assert float(percent) != 100.0
