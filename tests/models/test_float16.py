"""Half precision keeps the models within 1e-2 (relative to the output's max) of the float32
reference, on every device: the accuracy bar for the fast float16 path."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import load_fixture, nchw_to_nhwc, rel_err

import candle_nn as cn
from candle_nn_models.resnet import ResNet
from candle_nn_models.yolo_v8 import YoloV8

HALF = 1e-2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_resnet18_in_half_precision(device, dtype):
    io, _, folder = load_fixture("resnet18")
    vb = cn.VarBuilder.from_safetensors(folder / "weights.safetensors", dtype=dtype, device=device)
    model = ResNet.load(vb, "resnet18")
    logits = model(mx.array(nchw_to_nhwc(io["input.image"])).astype(vb.dtype))
    assert logits.dtype == vb.dtype
    err = rel_err(np.array(logits.astype(mx.float32)), io["output.logits"])
    # measured on the CPU: float16 9.2e-4, bfloat16 8.4e-3 (8-bit mantissa: a looser bar)
    assert err < (HALF if dtype == "float16" else 2 * HALF), err


def test_yolov8n_in_float16(device):
    io, _, folder = load_fixture("yolov8n")
    vb = cn.VarBuilder.from_safetensors(folder / "weights.safetensors", dtype="float16",
                                        device=device)
    pred = YoloV8.load(vb, "n", 80)(mx.array(nchw_to_nhwc(io["input.image"])).astype(mx.float16))
    err = rel_err(np.array(pred.astype(mx.float32)), io["output.pred"])
    assert err < HALF, err  # measured on the CPU: 2.6e-3
