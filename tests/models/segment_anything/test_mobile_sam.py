"""MobileSAM (TinyViT-5M) against the reference fixture, plus prompt-structure tests.

The 1024² encoder is slow on a small CPU, so it runs once per device (module-scoped fixture,
fed the fixture's ``output.encoder_input`` directly); every test reuses that embedding.
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

import candle_nn as cn
from conftest import DEVICES, assert_matches, load_fixture, nchw_to_nhwc, rel_err
from candle_nn_models.segment_anything import (PIXEL_MEAN, PIXEL_STD, ResizeLongestSide, Sam,
                                               SamPredictor)
from candle_nn_models.segment_anything.tiny_vit import attention_bias_index

OUTPUTS = ["image_embeddings", "image_pe", "sparse_embeddings", "dense_embeddings",
           "low_res_masks", "iou_predictions", "masks"]


@pytest.fixture(scope="module")
def fixture():
    io, meta, folder = load_fixture("mobile_sam")
    return SimpleNamespace(io=io, meta=meta, weights=folder / "weights.safetensors",
                           rgb=io["input.raw_rgb"], size=io["input.raw_rgb"].shape[:2])


@pytest.fixture(scope="module", params=DEVICES, ids=[str(d) for d in DEVICES])
def device(request) -> cn.Device:
    """Every available device, module-scoped so the encoder runs once per device."""
    return request.param


@pytest.fixture(scope="module")
def model(fixture, device):
    """Sam + predictor on ``device`` with the fixture's embedding set (one counted encoder run)."""
    sam = Sam.load(cn.VarBuilder.from_safetensors(fixture.weights, device=device))
    calls = []
    encoder_forward = sam.image_encoder.forward

    def counted(x):
        calls.append(x.shape)
        return encoder_forward(x)

    sam.image_encoder.forward = counted
    predictor = SamPredictor(sam)
    h, w = (int(v) for v in fixture.io["output.input_hw"])
    predictor.set_preprocessed_image(mx.array(nchw_to_nhwc(fixture.io["output.encoder_input"])),
                                     fixture.size, (h, w))
    return SimpleNamespace(sam=sam, predictor=predictor, encoder_calls=calls, device=device)


def input_frame(fixture, coords) -> mx.array:
    return mx.array(ResizeLongestSide(1024).apply_coords(np.asarray(coords), fixture.size))


@pytest.fixture(scope="module")
def reference_run(fixture, model):
    """Every output of the fixture's prompt (one foreground point, three masks)."""
    io, sam = fixture.io, model.sam
    points = (input_frame(fixture, io["input.point_coords"])[None],
              mx.array(io["input.point_labels"].astype(np.float32))[None])
    sparse, dense = sam.prompt_encoder(points)
    masks, iou, low_res = model.predictor.predict(io["input.point_coords"],
                                                  io["input.point_labels"],
                                                  multimask_output=True, return_logits=True)
    return {
        "image_embeddings": np.array(model.predictor.get_image_embedding()).transpose(0, 3, 1, 2),
        "image_pe": np.array(sam.get_dense_pe()).transpose(0, 3, 1, 2),
        "sparse_embeddings": np.array(sparse),
        "dense_embeddings": np.array(dense).transpose(0, 3, 1, 2),
        "low_res_masks": low_res[None], "iou_predictions": iou[None], "masks": masks[None],
    }


@pytest.mark.parametrize("key", OUTPUTS)
def test_matches_reference(key, fixture, reference_run):
    err = assert_matches(fixture.meta, key, reference_run[key], fixture.io[f"output.{key}"])
    print(f"{key}: rel err {err:.2e}")


def test_preprocessing_from_raw_rgb(fixture, model):
    """ResizeLongestSide + normalise + pad from the raw image (the README allows ~1e-2)."""
    transform = ResizeLongestSide(1024)
    resized = transform.apply_image(fixture.rgb)
    h, w = (int(v) for v in fixture.io["output.input_hw"])
    assert resized.shape == (h, w, 3)
    reference = nchw_to_nhwc(fixture.io["output.encoder_input"])
    x = model.sam.preprocess(mx.array(resized)[None])
    assert x.shape == (1, 1024, 1024, 3)
    assert rel_err(np.array(x), reference) < 1e-3  # measured 2.7e-4
    # Same PIL bilinear resize: the reference's pixels, un-normalised, are ours to within 0.05.
    pixels = reference[0, :h, :w] * PIXEL_STD + PIXEL_MEAN
    assert np.abs(pixels - resized).max() < 0.05
    assert not reference[0, h:].any() and not np.array(x)[0, h:].any()  # zero padding


def test_embedding_is_computed_once(fixture, model):
    """Prompting the predictor many times never re-runs the encoder."""
    before = len(model.encoder_calls)
    predictor = model.predictor
    for point in ([[580, 240]], [[100, 300]], [[700, 50]]):
        predictor.predict(np.array(point), np.array([1]))
    predictor.predict(box=np.array([100, 100, 500, 400]), multimask_output=False)
    assert before == 1 and len(model.encoder_calls) == 1


def test_set_image_runs_encoder_once(fixture, model):
    """set_image preprocesses and encodes exactly once; predict() calls reuse the embedding."""
    sam = Sam.load(cn.VarBuilder.from_safetensors(fixture.weights, device=model.device))
    embedding = model.predictor.get_image_embedding()
    inputs = []
    sam.image_encoder.forward = lambda x: inputs.append(x) or embedding  # stub: no 1024² run
    predictor = SamPredictor(sam)
    with pytest.raises(RuntimeError, match="set_image"):
        predictor.predict(np.array([[10, 10]]), np.array([1]))
    predictor.set_image(fixture.rgb)
    assert len(inputs) == 1 and inputs[0].shape == (1, 1024, 1024, 3)
    assert predictor.original_size == fixture.size and predictor.input_size == (712, 1024)
    for _ in range(3):
        masks, iou, low_res = predictor.predict(fixture.io["input.point_coords"],
                                                fixture.io["input.point_labels"],
                                                return_logits=True)
    assert len(inputs) == 1
    assert_matches(fixture.meta, "masks", masks[None], fixture.io["output.masks"])


# -- prompt encoder against NumPy ---------------------------------------------------------------
def numpy_pe(fixture, coords_px: np.ndarray) -> np.ndarray:
    """SAM's random-Fourier encoding of input-frame pixel coordinates, float64."""
    from safetensors.numpy import load_file

    name = "prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"
    g = load_file(str(fixture.weights))[name]
    c = 2 * math.pi * ((2 * (coords_px + 0.5) / 1024 - 1) @ g.astype(np.float64))
    return np.concatenate([np.sin(c), np.cos(c)], axis=-1)


def embedding(fixture, name: str) -> np.ndarray:
    from safetensors.numpy import load_file

    return load_file(str(fixture.weights))[f"prompt_encoder.{name}.weight"][0].astype(np.float64)


def test_prompt_encoder_points_and_box_numpy(fixture, model):
    """Positive + negative points with a box: no padding token; corners get embeddings 2 and 3."""
    pts = np.array([[[300.0, 200.0], [640.5, 100.25]]])
    box = np.array([[50.0, 60.0, 900.0, 700.0]])
    sparse, dense = model.sam.prompt_encoder(
        (mx.array(pts), mx.array([[1.0, 0.0]])), mx.array(box))
    ref = np.concatenate([
        numpy_pe(fixture, pts[0]) + np.stack([embedding(fixture, "point_embeddings.1"),
                                              embedding(fixture, "point_embeddings.0")]),
        numpy_pe(fixture, box.reshape(2, 2)) + np.stack([embedding(fixture, "point_embeddings.2"),
                                                         embedding(fixture, "point_embeddings.3")]),
    ])[None]
    assert sparse.shape == (1, 4, 256)
    assert rel_err(np.array(sparse), ref) < 1e-5
    no_mask = embedding(fixture, "no_mask_embed")
    assert dense.shape == (1, 64, 64, 256)
    assert rel_err(np.array(dense), np.broadcast_to(no_mask, (1, 64, 64, 256))) == 0


def test_prompt_encoder_negative_point_padding_numpy(fixture, model):
    """Points alone get a not-a-point padding token; label 0 adds point_embeddings.0."""
    pts = np.array([[[10.0, 1000.0]]])
    sparse, _ = model.sam.prompt_encoder((mx.array(pts), mx.array([[0.0]])))
    ref = np.stack([numpy_pe(fixture, pts[0])[0] + embedding(fixture, "point_embeddings.0"),
                    embedding(fixture, "not_a_point_embed")])[None]
    assert sparse.shape == (1, 2, 256)
    assert rel_err(np.array(sparse), ref) < 1e-5


def test_prompt_encoder_mask_input_numpy(fixture, model):
    """A mask prompt: two stride-2 2x2 convs with LayerNorm2d + GELU, then a 1x1 conv."""
    from safetensors.numpy import load_file

    t = {k[len("prompt_encoder.mask_downscaling."):]: v.astype(np.float64)
         for k, v in load_file(str(fixture.weights)).items()
         if k.startswith("prompt_encoder.mask_downscaling.")}
    erf = np.vectorize(math.erf)

    def conv2x2(x, w, b):  # NHWC, stride 2, PyTorch weight (O, I, 2, 2)
        n, h, wd, c = x.shape
        patches = x.reshape(n, h // 2, 2, wd // 2, 2, c)
        return np.einsum("bipjqc,ocpq->bijo", patches, w) + b

    def ln_gelu(x, i):
        mu = x.mean(-1, keepdims=True)
        x = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-6)
        x = x * t[f"{i}.weight"] + t[f"{i}.bias"]
        return 0.5 * x * (1 + erf(x / math.sqrt(2)))

    mask = np.random.default_rng(0).normal(size=(1, 256, 256, 1)).astype(np.float32) * 4
    x = ln_gelu(conv2x2(mask.astype(np.float64), t["0.weight"], t["0.bias"]), 1)
    x = ln_gelu(conv2x2(x, t["3.weight"], t["3.bias"]), 4)
    ref = np.einsum("bhwc,oc->bhwo", x, t["6.weight"][:, :, 0, 0]) + t["6.bias"]
    _, dense = model.sam.prompt_encoder(masks=mx.array(mask))
    assert dense.shape == (1, 64, 64, 256)
    assert rel_err(np.array(dense), ref) < 1e-5


def test_dense_positional_encoding_numpy(fixture, model):
    """image_pe is the encoding of the 64x64 grid's cell centres."""
    ys, xs = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    centres_px = np.stack([xs, ys], -1) * 16.0 + 8.0 - 0.5  # numpy_pe adds the half pixel back
    assert rel_err(np.array(model.sam.get_dense_pe())[0], numpy_pe(fixture, centres_px)) < 1e-5


def test_attention_bias_index_matches_mobile_sam_table():
    """The offset table as MobileSAM builds it: offsets numbered in order of first appearance."""
    for window in (7, 14):
        points = list(itertools.product(range(window), range(window)))
        offsets, idxs = {}, []
        for p1 in points:
            for p2 in points:
                off = (abs(p1[0] - p2[0]), abs(p1[1] - p2[1]))
                idxs.append(offsets.setdefault(off, len(offsets)))
        n = len(points)
        np.testing.assert_array_equal(attention_bias_index(window), np.array(idxs).reshape(n, n))



@pytest.mark.parametrize("hw", [(14, 14), (9, 17)])
def test_window_attention_image_order_equals_windows(hw):
    """The CPU order (norm and projections on the image, cn.window_attention) and the GPU order
    (image zero-padded and cut into windows) of WindowAttention agree, residual included."""
    from candle_nn_models.segment_anything.tiny_vit import WindowAttention

    varmap = cn.VarMap()
    attn = WindowAttention.load(cn.VarBuilder.from_varmap(varmap, seed=3, device="cpu"), 32, 2, 7)
    attn.attention_biases = mx.random.normal(attn.attention_biases.shape, key=mx.random.key(1))
    x = mx.random.normal((2, *hw, 32), key=mx.random.key(2))
    image_order = np.array(attn(x, residual=x))
    with mx.stream(mx.cpu):
        windows = np.array(attn._forward_windows(x, x))
    assert rel_err(windows, image_order) < 1e-5

# -- prompt kinds through the predictor ---------------------------------------------------------
def check_outputs(fixture, masks, iou, low_res, count):
    h, w = fixture.size
    assert masks.shape == (count, h, w) and masks.dtype == np.bool_
    assert iou.shape == (count,) and iou.dtype == np.float32
    assert low_res.shape == (count, 256, 256) and np.isfinite(low_res).all()


def test_box_prompt(fixture, model):
    masks, iou, low_res = model.predictor.predict(box=np.array([400, 100, 700, 500]))
    check_outputs(fixture, masks, iou, low_res, 3)


def test_negative_point_changes_prediction(fixture, model):
    pos = np.array([[580, 240]])
    _, iou_pos, low_pos = model.predictor.predict(pos, np.array([1]))
    masks, iou, low_res = model.predictor.predict(np.concatenate([pos, [[300, 400]]]),
                                                  np.array([1, 0]))
    check_outputs(fixture, masks, iou, low_res, 3)
    assert np.abs(low_res - low_pos).max() > 1e-3


def test_points_and_box(fixture, model):
    masks, iou, low_res = model.predictor.predict(np.array([[580, 240], [200, 500]]),
                                                  np.array([1, 0]),
                                                  box=np.array([400, 100, 700, 500]))
    check_outputs(fixture, masks, iou, low_res, 3)


def test_single_mask_output_is_mask_token_zero(fixture, model):
    """multimask_output=False returns mask 0 of the decoder; True returns masks 1..3, and the
    boolean masks are the upscaled logits thresholded at 0."""
    predictor, io = model.predictor, fixture.io
    single, iou1, low1 = predictor.predict(io["input.point_coords"], io["input.point_labels"],
                                           multimask_output=False)
    check_outputs(fixture, single, iou1, low1, 1)
    sam = model.sam
    points = (input_frame(fixture, io["input.point_coords"])[None],
              mx.array(io["input.point_labels"].astype(np.float32))[None])
    sparse, dense = sam.prompt_encoder(points)
    with sam.on_device():
        all_masks, all_iou = sam.mask_decoder.predict_masks(
            predictor.get_image_embedding(), sam.get_dense_pe(), sparse, dense)
    all_masks, all_iou = np.array(all_masks)[0].transpose(2, 0, 1), np.array(all_iou)[0]
    np.testing.assert_allclose(low1, all_masks[:1], rtol=0, atol=1e-6 * np.abs(all_masks).max())
    np.testing.assert_allclose(iou1, all_iou[:1], rtol=1e-6)
    np.testing.assert_allclose(fixture.io["output.low_res_masks"][0], all_masks[1:],
                               atol=1e-4 * np.abs(all_masks).max())
    logits, _, _ = predictor.predict(io["input.point_coords"], io["input.point_labels"],
                                     multimask_output=False, return_logits=True)
    np.testing.assert_array_equal(single, logits > 0)


def test_mask_input_prompt(fixture, model):
    _, _, low_res = model.predictor.predict(fixture.io["input.point_coords"],
                                            fixture.io["input.point_labels"])
    masks, iou, low = model.predictor.predict(fixture.io["input.point_coords"],
                                              fixture.io["input.point_labels"],
                                              mask_input=low_res[:1], multimask_output=False)
    check_outputs(fixture, masks, iou, low, 1)


def test_bad_predict_arguments(model):
    with pytest.raises(ValueError, match="point_labels"):
        model.predictor.predict(np.array([[1, 2]]))
    with pytest.raises(ValueError, match="labels"):
        model.predictor.predict(np.array([[1, 2], [3, 4]]), np.array([1]))
