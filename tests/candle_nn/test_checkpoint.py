"""Saving what you trained (candle_nn.save_safetensors) and refusing files in MLX's layout."""

from __future__ import annotations

import json
import struct

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

import candle_nn as cn
from conftest import fixture_dir
from candle_nn_models.resnet import ResNet
from candle_nn_models.segment_anything import Sam
from candle_nn_models.yolo_v8 import YoloV8


class Small(cn.Module):
    """Every layer kind that has a candle layout: conv (3→8 3x3: the same shape in MLX's and
    candle's layouts), grouped conv, transposed conv, BatchNorm, LayerNorm, Embedding, Linear."""

    def __init__(self, conv: cn.Conv2d, grouped: cn.Conv2d, bn: cn.BatchNorm2d,
                 up: cn.ConvTranspose2d, norm: cn.LayerNorm, embed: cn.Embedding,
                 head: cn.Linear) -> None:
        super().__init__(conv.device)
        self.conv, self.grouped, self.bn, self.up = conv, grouped, bn, up
        self.norm, self.embed, self.head = norm, embed, head

    @classmethod
    def load(cls, vb: cn.VarBuilder) -> "Small":
        return cls(cn.Conv2d.load(vb.pp("conv"), 3, 8, 3, cn.Conv2dConfig(padding=1)),
                   cn.Conv2d.load(vb.pp("grouped"), 8, 8, 3, cn.Conv2dConfig(padding=1, groups=2)),
                   cn.BatchNorm2d.load(vb.pp("bn"), 8),
                   cn.ConvTranspose2d.load(vb.pp("up"), 8, 4, 2,
                                           cn.ConvTranspose2dConfig(stride=2)),
                   cn.LayerNorm.load(vb.pp("norm"), 4), cn.Embedding.load(vb.pp("embed"), 10, 4),
                   cn.Linear.load(vb.pp("head"), 4, 10))

    def forward(self, x: mx.array, ids: mx.array) -> mx.array:
        y = self.up(cn.relu(self.bn(self.grouped(cn.relu(self.conv(x))))))
        y = self.norm(y).mean(axis=(1, 2)) + self.embed(ids)
        return self.head(y)


X = mx.random.normal((4, 8, 8, 3), key=mx.random.key(0))
IDS = mx.array([1, 2, 3, 4])


def _sgd_step(model: cn.Module, loss_of_output) -> None:
    """One mlx.optimizers.SGD step (MLX's optimisers replace the module's arrays)."""
    def loss(m):
        return loss_of_output(m)

    _, grads = nn.value_and_grad(model, loss)(model)
    optim.SGD(learning_rate=0.1).update(model, grads)
    mx.eval(model.parameters())


def _metadata(path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__") or {}


def test_trained_small_model_round_trips_in_candle_layout(tmp_path):
    varmap = cn.VarMap()
    model = Small.load(cn.VarBuilder.from_varmap(varmap, seed=3, device="cpu"))
    initial = model(X, IDS)
    _sgd_step(model, lambda m: nn.losses.cross_entropy(m(X, IDS), IDS).mean())
    trained = model(X, IDS)
    assert not mx.allclose(initial, trained), "the SGD step changed nothing: the test is vacuous"

    path = tmp_path / "trained.safetensors"
    written = cn.save_safetensors(model, path)
    assert _metadata(path)["candle_nn.layout"] == "candle"
    assert written["conv.weight"].shape == (8, 3, 3, 3)
    assert written["grouped.weight"].shape == (8, 4, 3, 3)
    assert written["up.weight"].shape == (8, 4, 2, 2)  # (I, O, kH, kW)
    assert written["head.weight"].shape == (10, 4)
    # candle's OIHW is the transpose of what the module holds (O, kH, kW, I)
    assert mx.array_equal(written["conv.weight"], model.conv.weight.transpose(0, 3, 1, 2))
    assert mx.array_equal(written["up.weight"], model.up.weight.transpose(3, 0, 1, 2))
    assert set(written) == set(varmap)  # the names the model was built from

    reloaded = Small.load(cn.VarBuilder.from_safetensors(path, device="cpu"))
    assert mx.array_equal(reloaded(X, IDS), trained)


def test_varmap_save_refuses_after_training_and_names_the_right_call(tmp_path):
    varmap = cn.VarMap()
    model = Small.load(cn.VarBuilder.from_varmap(varmap, seed=3, device="cpu"))
    varmap.save(tmp_path / "init.safetensors")  # untrained: the VarMap is the model
    _sgd_step(model, lambda m: nn.losses.cross_entropy(m(X, IDS), IDS).mean())
    with pytest.raises(cn.WeightsFileError, match=r"candle_nn\.save_safetensors\(model, path\)"):
        varmap.save(tmp_path / "stale.safetensors")
    assert not (tmp_path / "stale.safetensors").exists()


def test_varmap_save_refuses_for_a_trained_bn_folded_model(tmp_path):
    varmap = cn.VarMap()
    model = ResNet.load(cn.VarBuilder.from_varmap(varmap, seed=0, device="cpu"), "resnet18",
                        num_classes=4)
    varmap.save(tmp_path / "init.safetensors")
    model.update(tree_map(lambda p: p * 2, model.parameters()))
    with pytest.raises(cn.WeightsFileError, match="save_safetensors"):
        varmap.save(tmp_path / "stale.safetensors")


def test_trained_resnet18_round_trips_with_its_batch_norms_folded(tmp_path):
    vb = cn.VarBuilder.from_safetensors(fixture_dir("resnet18") / "weights.safetensors",
                                        device="cpu")
    model = ResNet.load(vb, "resnet18")
    x = mx.random.normal((2, 64, 64, 3), key=mx.random.key(1))
    target = mx.array([3, 7])
    before = model(x)
    _sgd_step(model, lambda m: nn.losses.cross_entropy(m(x), target).mean())
    after = model(x)
    assert not mx.allclose(before, after)

    path = tmp_path / "resnet18-trained.safetensors"
    written = cn.save_safetensors(model, path)
    assert _metadata(path)[cn.checkpoint.BATCH_NORM_KEY] == "folded"
    assert set(written) == set(vb.names())  # candle's names, every one of them
    # the folded BatchNorm is written as an identity carrying the shift
    assert mx.array_equal(written["bn1.weight"], mx.ones((64,)))
    assert mx.array_equal(written["bn1.running_mean"], mx.zeros((64,)))
    assert mx.array_equal(written["bn1.bias"], model.stem.bias)
    assert mx.array_equal(written["conv1.weight"], model.stem.weight.transpose(0, 3, 1, 2))

    reloaded_vb = cn.VarBuilder.from_safetensors(path, device="cpu")
    reloaded = ResNet.load(reloaded_vb, "resnet18")
    assert reloaded_vb.accessed() == set(written)
    assert mx.array_equal(reloaded(x), after)


def test_changed_yolov8n_round_trips(tmp_path):
    # MLX cannot differentiate YOLOv8's forward (no vjp for a view op); change it as a step would
    model = YoloV8.load(cn.VarBuilder.from_safetensors(
        fixture_dir("yolov8n") / "weights.safetensors", device="cpu"), variant="n", num_classes=80)
    model.update(tree_map(lambda p: p * 1.01 + 1e-3, model.parameters()))
    path = tmp_path / "yolo.safetensors"
    cn.save_safetensors(model, path)
    reloaded = YoloV8.load(cn.VarBuilder.from_safetensors(path, device="cpu"), variant="n",
                           num_classes=80)
    x = mx.random.normal((1, 64, 64, 3), key=mx.random.key(2))
    assert mx.array_equal(reloaded(x), model(x))


def test_changed_mobile_sam_round_trips(tmp_path):
    model = Sam.load(cn.VarBuilder.from_safetensors(
        fixture_dir("mobile_sam") / "weights.safetensors", device="cpu"))
    model.update(tree_map(lambda p: p * 1.01 + 1e-3, model.parameters()))
    path = tmp_path / "sam.safetensors"
    cn.save_safetensors(model, path)
    reloaded = Sam.load(cn.VarBuilder.from_safetensors(path, device="cpu"))
    ours, theirs = dict(tree_flatten(model.parameters())), dict(tree_flatten(reloaded.parameters()))
    assert ours.keys() == theirs.keys()
    assert all(mx.array_equal(ours[k], theirs[k]) for k in ours)


def test_mlx_save_weights_file_is_refused_when_shapes_coincide(tmp_path):
    """3→8 3x3 conv: (8, 3, 3, 3) in both layouts; MLX's writer gives the file away."""
    model = Small.load(cn.VarBuilder.from_varmap(cn.VarMap(), seed=1, device="cpu"))
    path = tmp_path / "mlx.safetensors"
    model.save_weights(str(path))
    with pytest.raises(cn.WeightsFileError,
                       match=r"'conv\.weight' comes from a file written by "
                             r"MLX .* candle_nn\.save_safetensors\(model, path\)"):
        Small.load(cn.VarBuilder.from_safetensors(path, device="cpu"))


def test_mlx_layout_is_refused_by_shape(tmp_path):
    """Grouped conv (8, 3, 3, 4) and transposed conv (4, 2, 2, 8) in MLX's layout."""
    model = Small.load(cn.VarBuilder.from_varmap(cn.VarMap(), seed=1, device="cpu"))
    tensors = cn.state_dict(model)
    for name, mlx_value in (("grouped.weight", model.grouped.weight),
                            ("up.weight", model.up.weight)):
        bad = dict(tensors, **{name: mlx_value})
        path = tmp_path / f"{name}.safetensors"
        cn.checkpoint.write_safetensors(path, bad)  # even with our marker: shapes decide
        with pytest.raises(cn.WeightsFileError, match=rf"'{name}' has shape .*MLX's \(O, kH, kW, "
                                                      r"I\) layout"):
            Small.load(cn.VarBuilder.from_safetensors(path, device="cpu"))


def test_candle_layout_files_of_other_writers_still_load(tmp_path):
    """candle's own files (safetensors' writer, no metadata) and marked MLX-written files load."""
    from safetensors.numpy import save_file

    model = Small.load(cn.VarBuilder.from_varmap(cn.VarMap(), seed=1, device="cpu"))
    tensors = {k: np.array(v) for k, v in cn.state_dict(model).items()}
    save_file(tensors, str(tmp_path / "st.safetensors"))
    mx.save_safetensors(str(tmp_path / "marked.safetensors"), cn.state_dict(model),
                        metadata={"candle_nn.layout": "candle"})
    for name in ("st.safetensors", "marked.safetensors"):
        again = Small.load(cn.VarBuilder.from_safetensors(tmp_path / name, device="cpu"))
        assert mx.array_equal(again(X, IDS), model(X, IDS))
    # and the published-layout fixture (no metadata; stem conv 3→16 3x3, ambiguous) loads as is
    YoloV8.load(cn.VarBuilder.from_safetensors(fixture_dir("yolov8n") / "weights.safetensors",
                                               device="cpu"), variant="n", num_classes=80)


def test_mlx_nn_layers_are_refused():
    class Mixed(cn.Module):
        def __init__(self) -> None:
            super().__init__(cn.Device.cpu())
            self.conv = nn.Conv2d(3, 4, 3)

    with pytest.raises(cn.WeightsFileError, match=r"'conv' is an mlx\.nn\.Conv2d"):
        cn.state_dict(Mixed())
