"""Input checks at the model boundary: ResNet, YOLOv8 and SAM refuse what people commonly pass by
mistake with one CandleNNError that names the fix (candle_nn.check_image_batch)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import candle_nn as cn
from candle_nn_models.resnet import ResNet
from candle_nn_models.segment_anything import Sam
from candle_nn_models.yolo_v8 import YoloV8


@pytest.fixture(scope="module")
def models() -> dict[str, tuple]:
    """name -> (model, a valid input's shape, the preprocessing the message must name)."""
    def vb(dtype="float32"):
        return cn.VarBuilder.from_varmap(cn.VarMap(), seed=0, device="cpu", dtype=dtype)

    return {
        "ResNet": (ResNet.load(vb(), "resnet18", num_classes=10), (1, 32, 32, 3),
                   "candle_nn_models.imagenet.preprocess"),
        "YoloV8": (YoloV8.load(vb(), "n", 80), (1, 64, 64, 3), "letterbox"),
        "Sam.embed": (lambda x, m=Sam.load(vb()): m.embed(x), (1, 1024, 1024, 3),
                      "Sam.preprocess"),
        "ResNet-f16": (ResNet.load(vb("float16"), "resnet18", num_classes=10), (1, 32, 32, 3),
                       None),
        "YoloV8-f16": (YoloV8.load(vb("float16"), "n", 80), (1, 64, 64, 3), None),
    }


NAMES = ["ResNet", "YoloV8", "Sam.embed"]


@pytest.mark.parametrize("name", NAMES)
def test_numpy_input_names_mx_array(models, name):
    model, shape, _ = models[name]
    with pytest.raises(cn.DTypeError, match=r"got a numpy\.ndarray; wrap it with mx\.array\(x\)"):
        model(np.zeros(shape, np.float32))


@pytest.mark.parametrize("name", NAMES)
def test_nchw_input_names_the_transpose(models, name):
    model, (n, h, w, c), _ = models[name]
    with pytest.raises(cn.ShapeMismatchError, match=rf"got \({n}, {c}, {h}, {w}\), which looks "
                                                    r"like NCHW: .*x\.transpose\(0, 2, 3, 1\)"):
        model(mx.zeros((n, c, h, w)))


@pytest.mark.parametrize("name", NAMES)
def test_single_image_names_the_batch_axis(models, name):
    model, shape, _ = models[name]
    with pytest.raises(cn.ShapeMismatchError, match=r"one image .*x\[None\]"):
        model(mx.zeros(shape[1:]))


@pytest.mark.parametrize("name", NAMES)
def test_uint8_pixels_name_the_preprocessing(models, name):
    model, shape, hint = models[name]
    with pytest.raises(cn.DTypeError, match=rf"got uint8 pixels: prepare images with "
                                            rf".*{hint}"):
        model(mx.zeros(shape, dtype=mx.uint8))


@pytest.mark.parametrize("name", ["ResNet-f16", "YoloV8-f16"])
def test_float32_input_to_a_float16_model_is_refused_not_upcast(models, name):
    model, shape, _ = models[name]
    with pytest.raises(cn.DTypeError, match=r"built in float16 but the input is float32: cast it "
                                            r"with x\.astype\(mx\.float16\)"):
        model(mx.zeros(shape))
    out = model(mx.zeros(shape, dtype=mx.float16))  # the fix works and computes in float16
    assert out.dtype == mx.float16


def test_errors_are_candle_nn_errors_and_valid_input_runs(models):
    model, shape, _ = models["ResNet"]
    for bad in (np.zeros(shape), mx.zeros((1, 3, 32, 32)), mx.zeros(shape, dtype=mx.uint8)):
        with pytest.raises(cn.CandleNNError):
            model(bad)
    assert model(mx.zeros(shape)).shape == (1, 10)


def test_sam_preprocess_gives_the_models_dtype():
    sam = Sam.load(cn.VarBuilder.from_varmap(cn.VarMap(), seed=0, device="cpu",
                                                  dtype="float16"))
    x = sam.preprocess(mx.zeros((1, 16, 16, 3), dtype=mx.uint8))
    assert x.dtype == mx.float16 and x.shape == (1, 1024, 1024, 3)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape,fragment", [((0, 64, 64, 3), "empty batch .*at least one image"),
                                            ((1, 0, 0, 3), "0x0 pixels.*at least one pixel")],
                         ids=["no_images", "0x0"])
def test_empty_batches_and_images_are_refused(models, name, shape, fragment):
    model, _, _ = models[name]
    with pytest.raises(cn.ShapeMismatchError, match=fragment):
        mx.eval(model(mx.zeros(shape)))


def test_empty_images_are_refused_by_every_preprocessing():
    from candle_nn_models.imagenet import preprocess, preprocess_batch
    from candle_nn_models.letterbox import letterbox

    empty = np.zeros((0, 0, 3), np.uint8)
    for fn in (preprocess, letterbox):
        with pytest.raises(cn.ShapeMismatchError, match=r"empty image \(0x0 pixels\)"):
            fn(empty)
    with pytest.raises(cn.ShapeMismatchError, match="no images: pass at least one"):
        preprocess_batch([])


@pytest.fixture(scope="module")
def predictor():
    from candle_nn_models.segment_anything import SamPredictor

    sam = Sam.load(cn.VarBuilder.from_varmap(cn.VarMap(), seed=0, device="cpu"))
    p = SamPredictor(sam)
    p.set_image_embedding(mx.zeros((1, 64, 64, 256)), (100, 120), (853, 1024))
    return p


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(box=[1, 2, 3]), r"box must be \(4,\) x1, y1, x2, y2 .* got shape \(3,\)"),
    (dict(box="a box"), "box must be numbers"),
    (dict(mask_input=np.zeros((1, 128, 128))), r"mask_input must be \(1, 256, 256\).*\(1, 128"),
    (dict(point_coords=[1, 2, 3], point_labels=[1]), r"point_coords must be \(N, 2\)"),
    (dict(point_coords=[[1, 2]]), "point_labels must be given"),
    (dict(point_coords=[[1, 2], [3, 4]], point_labels=[1]), "2 points but 1 labels"),
    (dict(box=[1, 2, np.nan, 4]), "finite"),
], ids=["box3", "box_text", "mask_128", "points3", "no_labels", "labels", "nan_box"])
def test_sam_predictor_prompts_are_checked(predictor, kwargs, fragment):
    with pytest.raises(cn.ShapeMismatchError, match=fragment):
        predictor.predict(**kwargs)


def test_sam_predictor_valid_prompts_still_run(predictor):
    masks, iou, low = predictor.predict(box=np.array([[1, 2, 30, 40]]), multimask_output=False)
    assert masks.shape == (1, 100, 120) and iou.shape == (1,) and low.shape == (1, 256, 256)
    masks, _, _ = predictor.predict(point_coords=[5, 6], point_labels=1, mask_input=low)
    assert masks.shape == (3, 100, 120)


def test_sam_set_image_refuses_an_empty_image(predictor):
    with pytest.raises(cn.ImageError, match="empty image"):
        predictor.set_image(np.zeros((0, 0, 3), np.uint8))


def test_postprocess_of_a_train_mode_output_names_eval() -> None:
    """A model in train() mode returns its raw per-level maps, a list: postprocess says to call
    eval() instead of failing inside NumPy."""
    from candle_nn_models.letterbox import letterbox
    from candle_nn_models.yolo_v8_post import postprocess

    model = YoloV8.load(cn.VarBuilder.from_varmap(cn.VarMap(), seed=0, device="cpu"), "n", 3,
                        fold_bn=False).train()
    lb = letterbox(np.full((64, 64, 3), 114, np.uint8), 64)
    raw = model(mx.array(lb.as_input()))
    with pytest.raises(cn.ShapeMismatchError, match=r"a list of 3 arrays.* model\.eval\(\)"):
        postprocess(raw, [lb], num_classes=3)
    assert len(postprocess(model.eval()(mx.array(lb.as_input())), [lb], num_classes=3)) == 1


def test_detection_loss_takes_a_device_string() -> None:
    from candle_nn_models.yolo_v8_loss import DetectionLoss

    assert DetectionLoss(3, device="cpu").device is cn.Device.cpu()
