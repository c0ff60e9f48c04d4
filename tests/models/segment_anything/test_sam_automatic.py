"""The automatic mask generator against MobileSAM's own ``SamAutomaticMaskGenerator``.

* with the fixture's (random) weights: the whole pipeline on the real model, ours vs MobileSAM;
* with a deterministic, point-dependent stand-in for the encoder and decoder installed on both
  sides (``helpers.sam_decoder_stand_in``): thresholds, NMS within and across crops, crop-edge
  filtering, uncropping, small-region clean-up and every output mode really get exercised;
* each ``amg`` helper against MobileSAM's ``utils/amg.py`` on random data.

Records are compared in order: same count; the same prompt point and crop box; boxes within
``BOX_TOL`` px; areas within ``AREA_TOL`` (relative); predicted IoU within ``SCORE_TOL``,
stability within ``STABILITY_TOL``; masks IoU >= ``MASK_IOU``. ``CANDLE_NN_PARITY_REPORT`` gets
one line per comparison.
"""

from __future__ import annotations

import contextlib

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map, tree_unflatten
import numpy as np
import pytest
from PIL import Image

import candle_nn as cn
from helpers.mobile_sam_reference import import_mobile_sam, reference_records
from helpers.sam_decoder_stand_in import install_on_ours
from conftest import DEVICES, FIXTURES, fixture_dir
from candle_nn_models.segment_anything import Sam, SamAutomaticMaskGenerator, ViTConfig
from candle_nn_models.segment_anything import amg
from candle_nn_models.segment_anything.amg.point_decoder import PointGridDecoder

BOX_TOL = 2  # px: a logit within float32 noise of 0 moves an edge by one pixel
AREA_TOL = 1e-3
SCORE_TOL = 1e-4  # predicted IoU
# Stability is a ratio of pixel counts at logits ±1: float32 noise flips a few pixels of a small
# mask there (measured up to 9.4e-5 with the seeded ViT below), so it gets 1e-3.
STABILITY_TOL = 1e-3
MASK_IOU = 0.99


@pytest.fixture(scope="module")
def mobile_sam():
    import torch  # the test extra's: a missing reference is a failure, never a skip

    torch.set_num_threads(2)
    module, stand_ins = import_mobile_sam()
    print(f"MobileSAM reference; stand-ins for: {stand_ins or 'nothing'}")
    return module


@pytest.fixture(scope="module")
def weights():
    return fixture_dir("mobile_sam") / "weights.safetensors"


@pytest.fixture(scope="module")
def bike() -> np.ndarray:
    from candle_nn_models.scripts.common import load_rgb

    return load_rgb(FIXTURES / "images" / "bike.jpg")  # 800x556


@pytest.fixture(scope="module")
def small_bike(bike) -> np.ndarray:
    return np.asarray(Image.fromarray(bike).resize((160, 111), Image.BILINEAR))


def mask_of(record) -> np.ndarray:
    seg = record["segmentation"]
    if isinstance(seg, np.ndarray):
        return seg
    if isinstance(seg["counts"], str):
        from pycocotools import mask as mask_utils

        return mask_utils.decode({"size": seg["size"],
                                  "counts": seg["counts"].encode()}).astype(bool)
    return amg.rle_to_mask(seg)


def compare_records(ours: list[dict], ref: list[dict], label: str) -> dict:
    """Assert record-by-record parity; returns the worst differences."""
    assert len(ours) == len(ref), f"{label}: {len(ours)} masks, MobileSAM {len(ref)}"
    worst = {"count": len(ref), "box": 0.0, "area": 0.0, "iou": 0.0, "stability": 0.0,
             "mask_iou": 1.0}
    for i, (a, b) in enumerate(zip(ours, ref)):
        where = f"{label} record {i}"
        assert set(a) == set(b), where
        np.testing.assert_allclose(a["point_coords"], b["point_coords"], atol=1e-6, err_msg=where)
        assert a["crop_box"] == b["crop_box"], where
        assert all(isinstance(v, int) for v in a["bbox"] + a["crop_box"] + [a["area"]]), where
        assert type(a["segmentation"]) is type(b["segmentation"]), where
        worst["box"] = max(worst["box"], float(np.abs(np.subtract(a["bbox"], b["bbox"])).max()))
        worst["area"] = max(worst["area"], abs(a["area"] - b["area"]) / max(b["area"], 1))
        worst["iou"] = max(worst["iou"], abs(a["predicted_iou"] - b["predicted_iou"]))
        worst["stability"] = max(worst["stability"],
                                 abs(a["stability_score"] - b["stability_score"]))
        ma, mb = mask_of(a), mask_of(b)
        assert ma.shape == mb.shape and ma.sum() == a["area"], where
        union = (ma | mb).sum()
        worst["mask_iou"] = min(worst["mask_iou"], (ma & mb).sum() / union if union else 1.0)
    report = cn.config.get("CANDLE_NN_PARITY_REPORT")
    if report:
        with open(report, "a") as fh:
            fh.write(f"{label}\t" + "\t".join(f"{k}={v:.3g}" for k, v in worst.items()) + "\n")
    print(f"{label}: {worst}")
    assert worst["box"] <= BOX_TOL and worst["area"] <= AREA_TOL, (label, worst)
    assert worst["iou"] <= SCORE_TOL and worst["stability"] <= STABILITY_TOL, (label, worst)
    assert worst["mask_iou"] >= MASK_IOU, (label, worst)
    return worst


# -- the real model on the fixture weights -----------------------------------------------------
# Random weights give masks that overlap almost completely, so NMS is off (1.0) to compare every
# mask; the thresholds sit between the reference's values (margins 0.006 and 0.09) so that both
# filters drop masks without a float32 tie.
REAL = dict(points_per_side=3, pred_iou_thresh=0.5, stability_score_thresh=0.05,
            box_nms_thresh=1.0)


@pytest.fixture(scope="module")
def real_reference(mobile_sam, weights, bike):
    return reference_records(weights, bike, [REAL])[0][0]


@pytest.mark.parametrize("device", DEVICES, ids=[str(d) for d in DEVICES])
def test_fixture_weights_match_mobile_sam(device, weights, bike, real_reference):
    sam = Sam.load(cn.VarBuilder.from_safetensors(weights, device=device))
    ours = SamAutomaticMaskGenerator(sam, **REAL).generate(bike)
    worst = compare_records(ours, real_reference, f"fixture weights {device}")
    assert 5 <= worst["count"] < 27  # 3x3 points x 3 masks, some dropped by each threshold


@pytest.mark.parametrize("path", ["kernels", "reference"])
def test_point_grid_decoder_matches_forward(weights, path):
    """The automatic masks' decoder (image side once, attention re-associated, image tokens
    factored, upscaling only for the listed masks, in chunks; the CPU kernels or their MLX
    references) against ``Sam.forward`` on the same single-point prompts: IoUs and the listed
    low-res logits within float32 rounding (1e-5 of their range)."""
    sam = Sam.load(cn.VarBuilder.from_safetensors(weights, device="cpu"))
    features = mx.random.normal((1, 64, 64, 256), key=mx.random.key(5))
    rng = np.random.default_rng(5)
    b = 2 * PointGridDecoder.chunk + 3  # three chunks, the last one short
    coords = rng.uniform(0, 1024, size=(b, 2)).astype(np.float32)
    low_res, iou = sam(features, (mx.array(coords)[:, None, :], mx.ones((b, 1))),
                       multimask_output=True)
    prompts = rng.permutation(np.repeat(np.arange(b), 2))[:b + 5]  # repeats, out of order
    which = rng.integers(0, 3, size=len(prompts))
    with cn.ops.disabled("point_probs", "point_norm", "point_pool", "mask_upscale") \
            if path == "reference" else contextlib.nullcontext():
        decoder = PointGridDecoder(sam, features)
        ours_iou, state = decoder.decode(mx.array(coords))
        ours = np.array(decoder.masks(state, prompts, which))
    np.testing.assert_allclose(np.array(ours_iou), np.array(iou), rtol=0, atol=1e-5)
    ref = np.array(low_res)[prompts, :, :, which]
    assert ours.shape == ref.shape == (len(prompts), 256, 256)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("ln_scale, spread, offset", [(10, 1, 0), (10, 10, 100)])
def test_point_grid_decoder_is_as_accurate_as_forward(weights, ln_scale, spread, offset):
    """The factored decoder takes its LayerNorm statistics from centred quadratic forms, which
    could cancel where trained weights (large LayerNorm gains, channel offsets in the image
    embedding) make a row's variance small against its terms. Stressed that way, its error
    against ``Sam.forward`` in float64 stays within 4x that of ``Sam.forward`` in float32
    (seed 8, 6 prompts; measured 0.14-2.8x; cancellation would cost orders of magnitude)."""
    with mx.stream(mx.cpu):  # float64 runs on the CPU only
        _stressed_decoder_errors(weights, ln_scale, spread, offset)


def _stressed_decoder_errors(weights, ln_scale, spread, offset):
    sam = Sam.load(cn.VarBuilder.from_safetensors(weights, device="cpu"))
    sam.update(tree_unflatten([(k, v * ln_scale if k.startswith("mask_decoder")
                                and "norm" in k and k.endswith("weight") else v)
                               for k, v in tree_flatten(sam.parameters())]))
    k1, k2 = mx.random.split(mx.random.key(8))
    features = (spread * mx.random.normal((1, 64, 64, 256), key=k1)
                + offset * mx.random.normal((1, 1, 1, 256), key=k2))
    rng = np.random.default_rng(8)
    coords = rng.uniform(0, 1024, size=(6, 2)).astype(np.float32)
    which = rng.integers(0, 3, size=len(coords))
    prompts = np.arange(len(coords))

    def forward(dtype):
        with cn.ops.disabled("cpu") if dtype == mx.float64 else contextlib.nullcontext():
            sam64 = Sam.load(cn.VarBuilder.from_safetensors(weights, device="cpu"))
            sam64.update(tree_map(lambda v: v.astype(dtype), sam.parameters()))
            low, iou = sam64(features.astype(dtype),
                             (mx.array(coords, dtype)[:, None, :], mx.ones((6, 1), dtype)),
                             multimask_output=True)
            return np.array(iou), np.array(low)[prompts, :, :, which]

    iou64, low64 = forward(mx.float64)
    iou32, low32 = forward(mx.float32)
    decoder = PointGridDecoder(sam, features)
    ours_iou, state = decoder.decode(mx.array(coords))
    ours = np.array(decoder.masks(state, prompts, which))
    for got, ref, f32 in ((np.array(ours_iou), iou64, iou32), (ours, low64, low32)):
        assert np.abs(got - ref).max() <= 4 * np.abs(f32 - ref).max() + 1e-6 * np.abs(ref).max()


def test_point_grid_decoder_compiled_matches_eager(weights):
    """``decode`` under ``mx.compile`` (the GPUs' default; the image side an input, one trace
    for two images) gives the eager IoUs and state within float32 rounding."""
    sam = Sam.load(cn.VarBuilder.from_safetensors(weights, device="cpu"))
    coords = mx.array(np.random.default_rng(7).uniform(0, 1024, size=(5, 2)).astype(np.float32))
    for seed in (6, 7):
        features = mx.random.normal((1, 64, 64, 256), key=mx.random.key(seed))
        eager = sam.point_grid_decoder(features).decode(coords)
        compiled = PointGridDecoder(sam, features, compiled=True).decode(coords)
        for ours, ref in zip(tree_flatten(compiled), tree_flatten(eager)):
            ref = np.array(ref[1])
            np.testing.assert_allclose(np.array(ours[1]), ref, rtol=0,
                                       atol=1e-5 * np.abs(ref).max())
    assert len(sam.__dict__["_point_grid_decode"]) == 1


# -- a ViT encoder (SAM ViT-B/L/H's architecture, small) ----------------------------------------
SMALL_VIT = ViTConfig(embed_dim=32, depth=2, num_heads=2, global_attn_indexes=(1,))


def test_vit_encoder_matches_mobile_sam(mobile_sam, small_bike, tmp_path):
    """The generator with a ViT encoder (SAM's ImageEncoderViT at 1024², two blocks: one windowed,
    one global) and seeded random weights for the whole model, ours vs MobileSAM's ``Sam`` built
    with the same ViT, on the same safetensors file."""
    varmap = cn.VarMap()
    Sam.load(cn.VarBuilder.from_varmap(varmap, seed=3, device="cpu"), SMALL_VIT)
    varmap.save(tmp_path / "vit.safetensors")
    vb = cn.VarBuilder.from_safetensors(tmp_path / "vit.safetensors", device="cpu")
    ours_sam = Sam.load(vb, SMALL_VIT)

    settings = dict(points_per_side=3, pred_iou_thresh=0.0, stability_score_thresh=0.0,
                    box_nms_thresh=1.0)
    theirs = reference_records(tmp_path / "vit.safetensors", small_bike, [settings],
                               model="vit")[0][0]
    ours = SamAutomaticMaskGenerator(ours_sam, **settings).generate(small_bike)
    compare_records(ours, theirs, "ViT encoder")


# -- the stand-in decoder: every stage of the pipeline ------------------------------------------
STAND_IN_CASES = {
    # MobileSAM's defaults (0.88 / 0.95 / NMS 0.7) on a 6x6 grid: 108 masks, 23 pass, NMS keeps 18
    "defaults": dict(points_per_side=6),
    "crops": dict(points_per_side=5, crop_n_layers=1, crop_nms_thresh=0.3,
                  output_mode="uncompressed_rle"),
    "small_regions": dict(points_per_side=6, min_mask_region_area=30, output_mode="coco_rle"),
    "point_grids": dict(points_per_side=None, points_per_batch=5, pred_iou_thresh=0.7,
                        stability_score_thresh=0.9, box_nms_thresh=0.5,
                        point_grids=[np.random.default_rng(0).uniform(size=(23, 2))]),
}


@pytest.fixture(scope="module")
def stand_in_reference(mobile_sam, weights, small_bike):
    """MobileSAM's records for each case, and its encoder call count."""
    runs = reference_records(weights, small_bike, list(STAND_IN_CASES.values()), stand_in=True)
    return dict(zip(STAND_IN_CASES, runs))


@pytest.fixture(scope="module", params=DEVICES, ids=[str(d) for d in DEVICES])
def stand_in_sam(request, weights):
    sam = Sam.load(cn.VarBuilder.from_safetensors(weights, device=request.param))
    return sam, install_on_ours(sam)


@pytest.fixture(scope="module")
def stand_in_ours(stand_in_sam, small_bike):
    """Our records for each case, and our encoder call count."""
    sam, calls = stand_in_sam
    out = {}
    for name, kwargs in STAND_IN_CASES.items():
        calls.clear()
        records = SamAutomaticMaskGenerator(sam, **kwargs).generate(small_bike)
        out[name] = (records, len(calls))
    return out


@pytest.mark.parametrize("case", list(STAND_IN_CASES))
def test_stand_in_decoder_matches_mobile_sam(case, stand_in_ours, stand_in_reference):
    ours, calls = stand_in_ours[case]
    ref, ref_calls = stand_in_reference[case]
    assert calls == ref_calls == (5 if case == "crops" else 1)  # the encoder: once per crop
    worst = compare_records(ours, ref, f"stand-in {case}")
    assert worst["count"] >= 8


def test_stand_in_cases_exercise_the_pipeline(stand_in_sam, stand_in_ours, small_bike):
    """The cases above are not trivial: each filter and each NMS drops masks, crops contribute
    masks, and the clean-up changes some."""
    sam, _ = stand_in_sam

    def count(**kwargs) -> int:
        return len(SamAutomaticMaskGenerator(sam, points_per_side=6, **kwargs).generate(small_bike))

    passing_iou = count(stability_score_thresh=0.0, box_nms_thresh=1.0)
    passing_both = count(box_nms_thresh=1.0)
    defaults = stand_in_ours["defaults"][0]
    # 6x6 points x 3 masks = 108; each filter, then the box NMS, drops some.
    assert 108 > passing_iou > passing_both > len(defaults) >= 8

    crops = stand_in_ours["crops"][0]
    assert len({tuple(r["crop_box"]) for r in crops}) >= 3
    no_crop_nms = SamAutomaticMaskGenerator(sam, **{**STAND_IN_CASES["crops"],
                                                    "crop_nms_thresh": 1.0}).generate(small_bike)
    assert len(crops) < len(no_crop_nms)

    def key(r):
        return tuple(r["point_coords"][0]) + (round(r["predicted_iou"], 6),)

    areas = {key(r): r["area"] for r in defaults}
    cleaned = stand_in_ours["small_regions"][0]
    assert any(areas.get(key(r), r["area"]) != r["area"] for r in cleaned), \
        "min_mask_region_area changed no mask"


def test_points_per_batch_leaves_the_records_alone(stand_in_sam, stand_in_ours, small_bike):
    """The default ``points_per_batch`` depends on the device (64 on the CPU, 256 on a GPU);
    the records do not: 23 points in batches of 5 (the case above) or 15 (15 + 8) give the
    same ones."""
    sam, _ = stand_in_sam
    kind = sam.device.kind
    assert SamAutomaticMaskGenerator(sam).points_per_batch == {"cpu": 64, "gpu": 256}[kind]
    records = SamAutomaticMaskGenerator(sam, **{**STAND_IN_CASES["point_grids"],
                                                "points_per_batch": 15}).generate(small_bike)
    expected = stand_in_ours["point_grids"][0]
    assert len(records) == len(expected) >= 3
    for got, want in zip(records, expected):
        assert got.keys() == want.keys()
        for k in got:
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), err_msg=k)


def test_progress_counts_the_points_and_can_end_the_run(stand_in_sam, stand_in_ours,
                                                        small_bike):
    """``generate(progress=)`` is told the points decoded so far, batch by batch over every crop
    (5 crops of a 5x5 grid, in batches of 7), ending at all of them, and leaves the records
    alone; an exception from it ends the run there (the next crop's encoder never runs)."""
    sam, calls = stand_in_sam
    case = {**STAND_IN_CASES["crops"], "points_per_batch": 7}
    seen: list[tuple[int, int]] = []
    records = SamAutomaticMaskGenerator(sam, **case).generate(
        small_bike, progress=lambda done, total: seen.append((done, total)))
    per_crop = [0, 7, 14, 21, 25]
    assert seen == [(0, 125)] + [(25 * crop + n, 125) for crop in range(5) for n in per_crop[1:]]
    assert json_ready(records) == json_ready(stand_in_ours["crops"][0])

    class Stop(Exception):
        pass

    def stop(done: int, total: int) -> None:
        if done >= 14:
            raise Stop

    calls.clear()
    with pytest.raises(Stop):
        SamAutomaticMaskGenerator(sam, **case).generate(small_bike, progress=stop)
    assert len(calls) == 1


def json_ready(records: list[dict]) -> list[dict]:
    return [{k: np.asarray(v).tolist() if k != "segmentation" else v for k, v in r.items()}
            for r in records]


def test_output_modes_hold_the_same_masks(stand_in_sam, small_bike):
    sam, _ = stand_in_sam
    by_mode = {mode: SamAutomaticMaskGenerator(sam, points_per_side=4, output_mode=mode)
               .generate(small_bike) for mode in ("binary_mask", "uncompressed_rle", "coco_rle")}
    binary = by_mode["binary_mask"]
    assert binary and all(r["segmentation"].dtype == np.bool_ for r in binary)
    assert all(r["segmentation"].shape == small_bike.shape[:2] for r in binary)
    for mode in ("uncompressed_rle", "coco_rle"):
        for a, b in zip(binary, by_mode[mode]):
            np.testing.assert_array_equal(mask_of(b), a["segmentation"])
    assert all(isinstance(r["segmentation"]["counts"], str) for r in by_mode["coco_rle"])


# -- the amg helpers against MobileSAM's utils/amg.py --------------------------------------------
def random_masks(rng, n=6, h=37, w=29) -> np.ndarray:
    masks = rng.uniform(size=(n, h, w)) > 0.6
    masks[0] = False
    masks[1] = True
    masks[2, :, :] = False
    masks[2, 5, 7] = True
    return masks


def test_rle_and_boxes_match_mobile_sam(mobile_sam):
    import torch
    from mobile_sam.utils import amg as ref

    masks = random_masks(np.random.default_rng(1))
    ours = amg.mask_to_rle(masks)
    assert ours == ref.mask_to_rle_pytorch(torch.from_numpy(masks))
    for rle, mask in zip(ours, masks):
        np.testing.assert_array_equal(amg.rle_to_mask(rle), mask)
        assert amg.area_from_rle(rle) == ref.area_from_rle(rle) == mask.sum()
        assert amg.coco_encode_rle(rle) == ref.coco_encode_rle(rle)
    np.testing.assert_array_equal(amg.batched_mask_to_box(masks),
                                  ref.batched_mask_to_box(torch.from_numpy(masks)).numpy())
    assert amg.batched_mask_to_box(masks)[2].tolist() == [7, 5, 7, 5]


def test_grids_and_crops_match_mobile_sam(mobile_sam):
    from mobile_sam.utils import amg as ref

    for n, layers, scale in ((32, 0, 1), (7, 2, 2), (5, 1, 1)):
        for a, b in zip(amg.build_all_layer_point_grids(n, layers, scale),
                        ref.build_all_layer_point_grids(n, layers, scale)):
            np.testing.assert_array_equal(a, b)
    for size, layers, ratio in (((556, 800), 2, 512 / 1500), ((111, 160), 1, 0.2),
                                ((1000, 300), 3, 0.5)):
        assert amg.generate_crop_boxes(size, layers, ratio) == ref.generate_crop_boxes(
            size, layers, ratio)


def test_stability_score_matches_mobile_sam(mobile_sam):
    import torch
    from mobile_sam.utils import amg as ref

    logits = np.random.default_rng(2).normal(scale=3.0, size=(5, 40, 50)).astype(np.float32)
    for offset in (1.0, 0.5):
        np.testing.assert_array_equal(
            np.array(amg.calculate_stability_score(mx.array(logits), 0.0, offset)),
            ref.calculate_stability_score(torch.from_numpy(logits), 0.0, offset).numpy())


def test_remove_small_regions_matches_opencv(mobile_sam):
    from mobile_sam.utils import amg as ref

    rng = np.random.default_rng(3)
    for i in range(12):
        mask = rng.uniform(size=(30, 40)) > (0.3 + 0.04 * i)
        for mode in ("holes", "islands"):
            for area in (1, 3, 10, 500):
                ours, changed = amg.remove_small_regions(mask, area, mode)
                theirs, ref_changed = ref.remove_small_regions(mask, area, mode)
                assert changed == ref_changed
                np.testing.assert_array_equal(ours, theirs)


def test_nms_matches_reference_nms(mobile_sam):
    """Greedy NMS with score ties (equal scores keep input order) and the 0.7 boundary."""
    import torch
    from torchvision.ops.boxes import batched_nms

    rng = np.random.default_rng(4)
    xy = rng.integers(0, 60, size=(80, 2))
    boxes = np.concatenate([xy, xy + rng.integers(1, 40, size=(80, 2))], axis=1)
    scores = rng.choice([0.5, 0.75, 1.0], size=80).astype(np.float32)  # many ties
    for thresh in (0.3, 0.5, 0.7, 1.0):
        ours = amg.nms(boxes, scores, thresh)
        theirs = batched_nms(torch.from_numpy(boxes).float(), torch.from_numpy(scores),
                             torch.zeros(80), iou_threshold=thresh).numpy()
        np.testing.assert_array_equal(ours, theirs)
    # IoU exactly 0.7 is kept (strictly greater suppresses), above it dropped.
    pair = np.array([[0, 0, 10, 10], [0, 0, 10, 7]])
    assert amg.nms(pair, np.array([1.0, 0.9]), 0.7).tolist() == [0, 1]
    assert amg.nms(pair, np.array([1.0, 0.9]), 0.69).tolist() == [0]


# -- the contract's checks --------------------------------------------------------------------
def test_bad_arguments(weights):
    sam = Sam.load(cn.VarBuilder.from_safetensors(weights, device="cpu"))
    with pytest.raises(ValueError, match="exactly one"):
        SamAutomaticMaskGenerator(sam, points_per_side=None)
    with pytest.raises(ValueError, match="exactly one"):
        SamAutomaticMaskGenerator(sam, point_grids=[np.zeros((1, 2))])
    with pytest.raises(ValueError, match="leaves crop layer 2 0 points"):
        SamAutomaticMaskGenerator(sam, points_per_side=3, crop_n_layers=2,
                                  crop_n_points_downscale_factor=2)
    with pytest.raises(ValueError, match="output_mode"):
        SamAutomaticMaskGenerator(sam, output_mode="polygon")
    with pytest.raises(ValueError, match="crop_n_layers=1 needs 2"):
        SamAutomaticMaskGenerator(sam, points_per_side=None, crop_n_layers=1,
                                  point_grids=[np.zeros((1, 2))])
    generator = SamAutomaticMaskGenerator(sam)
    assert (generator.points_per_batch, generator.pred_iou_thresh,
            generator.stability_score_thresh, generator.stability_score_offset,
            generator.box_nms_thresh, generator.crop_n_layers, generator.crop_nms_thresh,
            generator.crop_overlap_ratio, generator.crop_n_points_downscale_factor,
            generator.min_mask_region_area, generator.output_mode) == (
        64, 0.88, 0.95, 1.0, 0.7, 0, 0.7, 512 / 1500, 1, 0, "binary_mask")
    assert len(generator.point_grids) == 1 and generator.point_grids[0].shape == (1024, 2)
    with pytest.raises(cn.ImageError, match="uint8"):
        generator.generate(np.zeros((10, 10, 3), dtype=np.float32))
