"""The ultralytics reference imports without torchvision, builds its models from YAML without a
download, and its YOLOv8n gives our YoloV8's predictions on the same seeded weights (float32
tolerance of ``../shared/fixtures/README.md``: 1e-4 relative to the largest value)."""

from __future__ import annotations

import numpy as np
import torch

from helpers.ultralytics_reference import import_ultralytics


def test_ultralytics_yolov8n_from_yaml_matches_ours_on_its_seeded_weights(tmp_path):
    import_ultralytics()
    from ultralytics.nn.tasks import DetectionModel

    import candle_nn as cn
    import mlx.core as mx
    from candle_nn_models.weights.convert import convert_ultralytics, save

    torch.manual_seed(0)
    ref = DetectionModel("yolov8n.yaml", nc=80, verbose=False).eval()
    for m in ref.modules():  # non-trivial BatchNorm statistics, so folding is exercised
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    x = torch.rand(1, 3, 128, 160)
    with torch.no_grad():
        want = ref(x)[0].numpy()  # (1, 84, anchors): xywh boxes + class scores
    state = {k: v.numpy() for k, v in ref.state_dict().items()}
    converted = convert_ultralytics(state, source="seeded yolov8n.yaml")
    path = tmp_path / "y.safetensors"
    save(converted, path)
    from candle_nn_models.yolo_v8 import YoloV8

    model = YoloV8.load(cn.VarBuilder.from_safetensors(str(path)), "n", num_classes=80)
    got = np.asarray(model(mx.array(x.numpy().transpose(0, 2, 3, 1))))
    assert got.shape == want.shape
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 1e-4, err
