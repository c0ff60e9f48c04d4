"""Plain-layer parity: a ResNet-18 assembled here from candle_nn layers (not models/) and loaded
from the shared torchvision fixture under candle's tensor names matches its outputs."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_matches, nchw_to_nhwc, nhwc_to_nchw

import candle_nn as cn


def conv_bn(vb: cn.VarBuilder, conv: str, bn: str, cin: int, cout: int, k: int, stride: int,
            padding: int) -> cn.Conv2d:
    """A bias-free conv with its BatchNorm folded in."""
    config = cn.Conv2dConfig(padding=padding, stride=stride)
    c = cn.conv2d_no_bias(cin, cout, k, config, vb.pp(conv))
    return c.fold_batch_norm(cn.batch_norm(cout, 1e-5, vb.pp(bn)))


class BasicBlock(cn.Module):
    def __init__(self, vb: cn.VarBuilder, cin: int, cout: int, stride: int) -> None:
        super().__init__(vb.device)
        self.conv1 = conv_bn(vb, "conv1", "bn1", cin, cout, 3, stride, 1)
        self.conv2 = conv_bn(vb, "conv2", "bn2", cout, cout, 3, 1, 1)
        self.downsample = (conv_bn(vb.pp("downsample"), "0", "1", cin, cout, 1, stride, 0)
                           if stride != 1 or cin != cout else None)

    def forward(self, x: mx.array) -> mx.array:
        skip = x if self.downsample is None else self.downsample(x)
        return cn.relu(self.conv2(cn.relu(self.conv1(x))) + skip)


class ResNet18(cn.Module):
    def __init__(self, vb: cn.VarBuilder, num_classes: int = 1000) -> None:
        super().__init__(vb.device)
        self.stem = cn.Sequential(conv_bn(vb, "conv1", "bn1", 3, 64, 7, 2, 3), cn.relu,
                                  cn.MaxPool2d(3, 2, 1))
        widths, cin = [64, 128, 256, 512], 64
        self.stages = []
        for i, cout in enumerate(widths):
            stage = vb.pp(f"layer{i + 1}")
            self.stages.append(cn.Sequential(BasicBlock(stage.pp(0), cin, cout, 1 if i == 0 else 2),
                                             BasicBlock(stage.pp(1), cout, cout, 1)))
            cin = cout
        self.fc = cn.linear(512, num_classes, vb.pp("fc"))

    def forward(self, x: mx.array) -> dict[str, mx.array]:
        """``(N, 224, 224, 3)`` → NHWC stage outputs and ``logits`` ``(N, classes)``."""
        out = {"stem": self.stem(x)}
        h = out["stem"]
        for i, stage in enumerate(self.stages):
            h = out[f"layer{i + 1}"] = stage(h)
        out["logits"] = self.fc(h.mean(axis=(1, 2)))
        return out


@pytest.fixture(scope="module")
def fixture(resnet18_fixture):
    return resnet18_fixture


@pytest.fixture(scope="module", params=cn.Device.available(), ids=str)
def outputs(request, fixture):
    io, _, folder = fixture
    vb = cn.VarBuilder.from_safetensors(folder / "weights.safetensors", dtype=mx.float32,
                                        device=request.param)
    model = ResNet18(vb)
    assert model.device == request.param
    # Every tensor of the file is used (nothing silently ignored).
    assert vb.accessed() == set(vb.names())
    out = model(mx.array(nchw_to_nhwc(io["input.image"])))
    mx.eval(out)
    assert all(v.dtype == mx.float32 for v in out.values())
    return {k: np.array(v) for k, v in out.items()}


@pytest.mark.parametrize("key", ["stem", "layer1", "layer2", "layer3", "layer4", "logits"])
def test_resnet18_from_layers_matches_torchvision(outputs, fixture, key):
    io, meta, _ = fixture
    got = outputs[key] if key == "logits" else nhwc_to_nchw(outputs[key])
    assert_matches(meta, key, got, io[f"output.{key}"])
