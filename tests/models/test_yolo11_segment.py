"""Yolo11Seg against ultralytics' own ``yolo11n-seg`` on seeded weights
(helpers/yolo11_reference.py) and bike.jpg: the head's output and the prototypes within the
float32 rule of ``../shared/fixtures/README.md``, and the final masks of ``process_mask`` /
``process_mask_native`` (IoU >= 0.999 after thresholding), on every available device."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch
from PIL import Image

import candle_nn as cn
from conftest import fixture_dir
from helpers.ultralytics_models import convert_and_save, tolerance
from helpers.yolo11_reference import seeded_model
from candle_nn_models.letterbox import letterbox
from candle_nn_models.yolo11 import Yolo11Seg, Yolo11Spec
from candle_nn_models.yolo_checkpoint import load_model
from candle_nn_models.yolo_v8_masks import segment_postprocess

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


def _reference(ref, x, dtype):
    with torch.no_grad():
        (pred, proto), _ = ref.to(dtype)(torch.from_numpy(x).permute(0, 3, 1, 2).to(dtype))
    ref.float()
    return pred, proto


def test_head_output_and_prototypes_match_ultralytics(setup, device):
    ref, path, lb = setup
    model = _ours(path, device)
    assert isinstance(model, Yolo11Seg)
    assert model.spec == Yolo11Spec("n", "segment", 80, num_masks=32)
    assert str(model.spec) == "YOLO11n-seg (80 classes, 32 masks)"
    x = lb.as_input()
    pred, protos = model(mx.array(x))
    want32 = [t.numpy() for t in _reference(ref, x, torch.float32)]
    want64 = [t.numpy() for t in _reference(ref, x, torch.float64)]
    assert pred.shape == want32[0].shape == (1, 4 + 80 + 32, 16 * 20 + 8 * 10 + 4 * 5)
    for got, index in ((np.asarray(pred), 0), (np.asarray(protos).transpose(0, 3, 1, 2), 1)):
        tol = tolerance(want32[index], want64[index])
        want = want32[index]
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err <= tol, (index, err, tol)


@pytest.mark.parametrize("retina", [False, True])
def test_masks_match_ultralytics_process_mask(setup, device, retina):
    from ultralytics.utils import ops
    from ultralytics.utils.nms import non_max_suppression

    ref, path, lb = setup
    model = _ours(path, device)
    x = lb.as_input()
    pred, protos = model(mx.array(x))
    ((detections, masks),) = segment_postprocess(pred, protos, [lb], num_classes=80,
                                                 num_masks=32, retina=retina, conf=0.25,
                                                 iou=0.7)
    want_pred, want_proto = _reference(ref, x, torch.float32)
    want = non_max_suppression(want_pred, 0.25, 0.7, nc=80)[0]
    assert 3 <= len(want) <= 300, len(want)
    if retina:
        want[:, :4] = ops.scale_boxes(x.shape[1:3], want[:, :4], lb.orig_hw)
        want_masks = ops.process_mask_native(want_proto[0], want[:, 6:], want[:, :4], lb.orig_hw)
    else:
        want_masks = ops.process_mask(want_proto[0], want[:, 6:], want[:, :4], x.shape[1:3],
                                      upsample=True)
        want[:, :4] = ops.scale_boxes(x.shape[1:3], want[:, :4], lb.orig_hw)
    keep = want_masks.amax((-2, -1)) > 0
    want, want_masks = want[keep].numpy(), want_masks[keep].numpy()
    assert len(detections) == len(want) >= 3
    np.testing.assert_allclose(np.stack([d.box_xyxy for d in detections]), want[:, :4],
                               atol=1e-3 * SIZE)
    assert [d.class_id for d in detections] == want[:, 5].astype(int).tolist()
    assert masks.data.shape == want_masks.shape
    for got, ref_mask in zip(masks.data.astype(bool), want_masks.astype(bool)):
        iou = (got & ref_mask).sum() / max((got | ref_mask).sum(), 1)
        assert iou >= 0.999, iou
