"""Yolo11Seg against ultralytics' own ``yolo11n-seg`` on seeded weights
(helpers/yolo11_reference.py) and bike.jpg: the head's output and the prototypes within the
float32 rule of ``../shared/fixtures/README.md``, and the final masks of ``process_mask`` /
``process_mask_native`` (IoU >= 0.999 after thresholding), on every available device."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image

import candle_nn as cn
from conftest import fixture_dir
from helpers.segment_parity import assert_head_matches, assert_masks_match
from helpers.ultralytics_models import convert_and_save
from helpers.yolo11_reference import seeded_model
from candle_nn_models.letterbox import letterbox
from candle_nn_models.yolo11 import Yolo11Seg, Yolo11Spec
from candle_nn_models.yolo_checkpoint import load_model

SIZE = 160


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    rgb = np.asarray(Image.open(fixture_dir("images") / "bike.jpg").convert("RGB"))
    lb = letterbox(rgb, SIZE, auto=True)
    x = lb.as_input()
    ref = seeded_model("yolo11n-seg.yaml", np.ascontiguousarray(x.transpose(0, 3, 1, 2)), nc=80)
    path = convert_and_save(ref, tmp_path_factory.mktemp("seg11") / "seg.safetensors")
    return ref, path, lb


def _ours(path, device) -> Yolo11Seg:
    return load_model(cn.VarBuilder.from_safetensors(str(path), device=device))


def test_head_output_and_prototypes_match_ultralytics(setup, device):
    ref, path, lb = setup
    model = _ours(path, device)
    assert isinstance(model, Yolo11Seg)
    assert model.spec == Yolo11Spec("n", "segment", 80, num_masks=32)
    assert str(model.spec) == "YOLO11n-seg (80 classes, 32 masks)"
    pred, protos = model(mx.array(lb.as_input()))
    assert pred.shape == (1, 4 + 80 + 32, 16 * 20 + 8 * 10 + 4 * 5)
    assert_head_matches(ref, lb.as_input(), np.asarray(pred), np.asarray(protos), str(device))


@pytest.mark.parametrize("retina", [False, True])
def test_masks_match_ultralytics_process_mask(setup, device, retina):
    ref, path, lb = setup
    pred, protos = _ours(path, device)(mx.array(lb.as_input()))
    assert_masks_match(ref, lb, np.asarray(pred), np.asarray(protos), retina)
