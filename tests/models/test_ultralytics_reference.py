"""The ultralytics reference imports without torchvision, builds its models from YAML without a
download, and its YOLOv8n gives our YoloV8's predictions on the same seeded weights (float32
tolerance of ``../shared/fixtures/README.md``: 1e-4 relative to the largest value)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from helpers.ultralytics_reference import KEPT_ENVIRONMENT, import_ultralytics

TESTS = Path(__file__).resolve().parent.parent


def test_importing_ultralytics_leaves_the_process_as_it_was():
    """ultralytics sets OMP_NUM_THREADS=1 (and more) and replaces PIL.Image.open and torch.save
    when imported; through import_ultralytics none of it outlives the import, so no later test
    of the session, nor a CLI it runs, reads images through ultralytics' patch or runs with one
    BLAS thread. In a fresh interpreter, with the variables unset."""
    code = ("import json, os, sys; sys.path.insert(0, sys.argv[1]); before = dict(os.environ); "
            "import torch; from PIL import Image; functions = (Image.open, torch.save); "
            "from helpers.ultralytics_reference import import_ultralytics as i; "
            "i(); after = dict(os.environ); "
            "assert (Image.open, torch.save) == functions, (Image.open, torch.save); "
            "print(json.dumps({k: [before.get(k), after.get(k)] for k in set(before) | set(after) "
            "if before.get(k) != after.get(k)}))")
    leaked = ("OMP_NUM_THREADS", "NUMEXPR_MAX_THREADS", "TF_CPP_MIN_LOG_LEVEL",
              "TORCH_CPP_LOG_LEVEL", "KINETO_LOG_LEVEL", "LD_LIBRARY_PATH")
    env = {k: v for k, v in os.environ.items() if k not in leaked + KEPT_ENVIRONMENT}
    done = subprocess.run([sys.executable, "-c", code, str(TESTS)], env=env, timeout=300,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    changed = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(changed) == set(KEPT_ENVIRONMENT), changed


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
