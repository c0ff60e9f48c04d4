"""YoloV8Cls against ultralytics' own ClassificationModel on seeded weights and a real image
(probabilities within the float32 rule of ``../shared/fixtures/README.md``, on every device), its
preprocessing
(ultralytics' ``classify_transforms``: no mean/std), and its weight checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import FIXTURES
from helpers.ultralytics_models import convert_and_save, seeded, tolerance


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import candle_nn as cn
    from PIL import Image

    from candle_nn_models.yolo_v8 import load_model
    from candle_nn_models.yolo_v8_classify import preprocess

    ref = seeded("ClassificationModel", "yolov8n-cls.yaml", nc=10)
    path = convert_and_save(ref, tmp_path_factory.mktemp("cls") / "cls.safetensors")
    model = load_model(cn.VarBuilder.from_safetensors(str(path)))
    rgb = np.asarray(Image.open(FIXTURES / "images" / "bike.jpg").convert("RGB"))
    return ref, model, preprocess(rgb)[None], path


def _reference(ref, x, dtype):
    with torch.no_grad():
        probs, _ = ref.to(dtype)(torch.from_numpy(x).permute(0, 3, 1, 2).to(dtype))
    ref.float()
    return probs.double().numpy()


def test_probabilities_match_ultralytics(setup, device):
    import candle_nn as cn
    import mlx.core as mx

    from candle_nn_models.yolo_v8 import load_model
    from candle_nn_models.yolo_v8_classify import YoloV8Cls

    ref, _, x, path = setup
    model = load_model(cn.VarBuilder.from_safetensors(str(path), device=device))
    assert isinstance(model, YoloV8Cls) and (model.variant, model.num_classes) == ("n", 10)
    with model.on_device():
        got = np.array(model(mx.array(x)))
    want = _reference(ref, x, torch.float32)
    assert got.shape == want.shape == (1, 10)
    assert abs(got.sum() - 1) < 1e-5
    err = np.abs(got - want).max() / np.abs(want).max()
    tol = tolerance(want, _reference(ref, x, torch.float64))
    print(f"probabilities on {device}: rel err {err:.2e} (tolerance {tol:.2e})")
    assert err <= tol, (err, tol)
    assert got.argmax() == want.argmax()


def test_preprocess_is_resize_crop_224_without_normalisation():
    from PIL import Image

    from candle_nn_models.yolo_v8_classify import preprocess

    rgb = np.asarray(Image.open(FIXTURES / "images" / "bike.jpg").convert("RGB"))  # 800x556
    got = preprocess(rgb)
    # torchvision's Resize(224) on a PIL image: shorter side 224, the longer truncated
    # (800 * 224 / 556 = 322.3 -> 322), bilinear with antialiasing; CenterCrop(224); ToTensor.
    resized = np.asarray(Image.fromarray(rgb).resize((322, 224), Image.Resampling.BILINEAR))
    left = int(round((322 - 224) / 2.0))
    want = resized[:, left:left + 224].astype(np.float32) / 255
    assert got.shape == (224, 224, 3) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_weights_of_another_classifier_are_named(setup):
    import candle_nn as cn

    from candle_nn_models.yolo_v8 import YoloV8, YoloV8Cls

    *_, path = setup
    vb = cn.VarBuilder.from_safetensors(str(path))
    with pytest.raises(cn.ShapeMismatchError, match=r"YOLOv8n-cls \(10 classes\), not "
                                                    r"YOLOv8n-cls \(1000 classes\)"):
        YoloV8Cls.load(vb, "n", 1000)
    with pytest.raises(cn.ShapeMismatchError, match="YOLOv8n-cls"):
        YoloV8.load(cn.VarBuilder.from_safetensors(str(path)), "n", 10)
