"""YoloV8Seg against ultralytics' own SegmentationModel on seeded weights and a real image: the
head's raw output, the prototypes (float32 rule of ``../shared/fixtures/README.md``), and the final
masks of ``process_mask`` / ``process_mask_native`` (IoU >= 0.999 after thresholding), on every
device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import FIXTURES
from helpers.segment_parity import assert_head_matches, assert_masks_match, iou
from helpers.ultralytics_models import convert_and_save, seeded

SIZE = 160  # small: the parity does not depend on the size, CI has 2 cores


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import candle_nn as cn
    from PIL import Image

    from candle_nn_models.letterbox import letterbox
    from candle_nn_models.yolo_v8 import load_model

    ref = seeded("SegmentationModel", "yolov8n-seg.yaml", nc=80)
    path = convert_and_save(ref, tmp_path_factory.mktemp("seg") / "seg.safetensors")
    rgb = np.asarray(Image.open(FIXTURES / "images" / "bike.jpg").convert("RGB"))
    lb = letterbox(rgb, SIZE, auto=True)
    cache: dict = {}

    def ours(device):
        """``(pred, protos)`` of our model on ``device`` for the letterboxed image (NumPy)."""
        if str(device) not in cache:
            import mlx.core as mx

            model = load_model(cn.VarBuilder.from_safetensors(str(path), device=device))
            out = model.intermediates(mx.array(lb.as_input()))
            cache[str(device)] = np.array(out["pred"]), np.array(out["protos"])
        return cache[str(device)]

    return ref, ours, lb


def test_head_output_and_prototypes_match_ultralytics(setup, device):
    ref, ours, lb = setup
    pred, protos = ours(device)
    assert pred.shape == (1, 4 + 80 + 32, 16 * 20 + 8 * 10 + 4 * 5)
    assert protos.shape == (1, 32, 40, 32)  # (N, H/4, W/4, masks) of the 128x160 input
    assert_head_matches(ref, lb.as_input(), pred, protos, str(device))


@pytest.mark.parametrize("retina", [False, True])
def test_masks_match_ultralytics_process_mask(setup, retina, device):
    from ultralytics.utils import ops

    ref, ours, lb = setup
    pred, protos = ours(device)
    detections, masks, want_masks = assert_masks_match(ref, lb, pred, protos, retina)
    print(f"{len(detections)} masks (retina={retina}) on {device}: min IoU "
          f"{min(iou(g, w) for g, w in zip(masks.data, want_masks)):.6f}")
    # on the original image: ultralytics' scale_masks of the 0/1 masks
    scaled = ops.scale_masks(torch.from_numpy(want_masks[None]).float(), lb.orig_hw)[0] > 0.5
    for det, ref_mask in zip(detections, scaled.numpy()):
        assert det.mask.shape == lb.orig_hw
        assert iou(det.mask, ref_mask) >= 0.999


def test_polygons_match_ultralytics_masks_xyn(setup):
    import candle_nn as cn
    from ultralytics.engine.results import Masks

    from candle_nn_models.yolo_v8_masks import segment_postprocess

    _, ours, lb = setup
    pred, protos = ours(cn.Device.cpu())
    ((_, masks),) = segment_postprocess(pred, protos, [lb], num_classes=80, num_masks=32)
    want = Masks(torch.from_numpy(masks.data), lb.orig_hw).xyn
    got = masks.segments()
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-6)


def test_prototype_resolution_masks_match_ultralytics(setup):
    """``process_mask(..., upsample=False)``: the masks at the prototypes' resolution, boxes
    scaled down to it."""
    import candle_nn as cn
    from ultralytics.utils import ops
    from ultralytics.utils.nms import non_max_suppression

    from candle_nn_models.yolo_v8_masks import process_mask

    _, ours, lb = setup
    pred, protos = ours(cn.Device.cpu())
    kept = non_max_suppression(torch.from_numpy(pred), 0.25, 0.7, nc=80)[0]
    assert len(kept) >= 3
    proto = torch.from_numpy(protos[0]).permute(2, 0, 1)
    want = ops.process_mask(proto, kept[:, 6:], kept[:, :4], lb.input_hw, upsample=False).numpy()
    got = process_mask(protos[0], kept[:, 6:].numpy(), kept[:, :4].numpy(), lb.input_hw,
                       upsample=False)
    assert got.shape == want.shape == (len(kept), *protos.shape[1:3])
    assert min(iou(g, w) for g, w in zip(got, want)) >= 0.999
