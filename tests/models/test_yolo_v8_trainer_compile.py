"""The trainer's compiled step (``compile=True``: ``mx.compile`` over the forward and backward,
ground truth padded to fixed shapes) computes what the eager step does.

MLX's CPU compiler builds C++ for minutes on yolov8n's training graph, too slow for CI, so this
test runs the compiled path's own code (the padding of the targets to ``TARGET_ROWS`` rows and
8-slot multiples, the model state threaded through ``mx.compile(inputs=, outputs=)``) with
MLX's compilation switched off (``mx.disable_compile``): loss items, gradients, BatchNorm
statistics and the weights after two optimizer steps equal the eager trainer's to 1e-5 (bit-equal
on the CPU; on an H100 the float32 sums over padded and unpadded targets round apart by 2e-6).
The same two steps with the real compilation on the CPU (2 shared cores) gave bit-identical
loss items and weights, the first step taking about 50 s to compile.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from conftest import FIXTURES
from helpers.shapes_dataset import make_shapes

WEIGHTS = FIXTURES / "yolov8n" / "weights.safetensors"


def _trainer(tmp_path, compile: bool):
    import candle_nn as cn
    from candle_nn_models.yolo_v8 import YoloV8
    from candle_nn_models.yolo_v8_data import DataConfig
    from candle_nn_models.yolo_v8_dataset import DetectionDataset
    from candle_nn_models.yolo_v8_trainer import DetectionTrainer, TrainConfig, new_class_head

    data = DataConfig.load(make_shapes(tmp_path / "shapes", n_train=8, n_val=2, size=64))
    train = DetectionDataset(data.images("train"), data.names, 64, augment=True, seed=0,
                             cache=False)
    tensors = new_class_head({k: v for k, v in mx.load(str(WEIGHTS)).items()
                              if not k.startswith("head.cv4.")}, 3, 0)
    model, ema = (YoloV8.load(cn.VarBuilder.from_tensors(tensors), "n", num_classes=3,
                              fold_bn=False) for _ in range(2))
    config = TrainConfig(epochs=1, batch=4, imgsz=64, nbs=4, warmup_epochs=0, optimizer="SGD")
    return DetectionTrainer(model, ema, config, train, train, tmp_path / "run", compile=compile)


def test_compiled_step_equals_eager(tmp_path):
    from candle_nn_models.yolo_v8_dataset import collate
    from candle_nn_models.yolo_v8_trainer import _flat

    eager = _trainer(tmp_path / "a", compile=False)
    mx.disable_compile()
    try:
        compiled = _trainer(tmp_path / "b", compile=True)
        assert compiled.compiled and compiled._step is not compiled._eager_step
        for ni, batch in enumerate(eager.batches(0)):
            x, targets = collate([eager.train_set.sample(int(i), 0, True) for i in batch])
            assert len(targets) % 64 and len(targets) > 0  # padding is exercised
            got = compiled.iteration(ni, 0, mx.array(x), targets)
            want = eager.iteration(ni, 0, mx.array(x), targets)
            np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5)
    finally:
        mx.enable_compile()
    assert eager.updates == compiled.updates == 2
    a, b = _flat(eager.model.parameters()), _flat(compiled.model.parameters())
    worst = max(float(np.abs(np.array(a[k]) - np.array(b[k])).max()
                      / max(np.abs(np.array(a[k])).max(), 1e-12)) for k in a)
    assert worst < 1e-5, worst
