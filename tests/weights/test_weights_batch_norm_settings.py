"""BatchNorm eps and momentum come from the source model: ``convert`` records them in the file
(``candle_nn.bn_eps``, ``candle_nn.bn_momentum``), every model's BatchNorms load with them, and
``save_safetensors`` writes them back. References: ultralytics' own models (seeded, from their
YAML) whose BatchNorm statistics make eps matter — running variances of 1e-4..1e-3, where eps 1e-3
instead of 1e-5 changes a layer's scale up to 3x — compared in the test, in float32, within the
fixtures' float32 rule (10x ultralytics' own float32-vs-float64 error)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.ultralytics_models import seeded, tolerance
from candle_nn_models.weights.cli import main
from candle_nn_models.weights.metadata import read_metadata


def _eps_matters(model, eps: float | None = None):
    """Small running variances, BatchNorm weights that keep activations near unit scale, and
    (``eps``) every BatchNorm's eps set as a source model could have it."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                var = torch.rand(m.running_var.shape, generator=gen) * 9e-4 + 1e-4
                m.running_var.copy_(var)
                m.weight.copy_((var + 1e-4).sqrt() * (0.5 + torch.rand(var.shape, generator=gen)))
                if eps is not None:
                    m.eps = eps
    return model


def _reference(ref, x: np.ndarray, dtype) -> np.ndarray:
    with torch.no_grad():
        out = ref.to(dtype)(torch.from_numpy(x).permute(0, 3, 1, 2).to(dtype))
    ref.float()
    while isinstance(out, (tuple, list)):  # the decoded prediction (before protos, raw maps)
        out = out[0]
    return out.double().numpy()


@pytest.mark.parametrize("kind, yaml, eps, want", [
    # ultralytics' classifiers never run initialize_weights: PyTorch's 1e-5, momentum 0.1
    ("ClassificationModel", "yolov8n-cls.yaml", None, (1e-5, 0.1)),
    ("ClassificationModel", "yolo11n-cls.yaml", None, (1e-5, 0.1)),
    # detectors get 1e-3 / 0.03 from initialize_weights; a source model set otherwise is kept
    ("DetectionModel", "yolov8n.yaml", None, (1e-3, 0.03)),
    ("DetectionModel", "yolov8n.yaml", 1e-5, (1e-5, 0.03)),
    ("DetectionModel", "yolo11n.yaml", 1e-5, (1e-5, 0.03)),
    ("SegmentationModel", "yolov8n-seg.yaml", 1e-5, (1e-5, 0.03)),
    ("PoseModel", "yolo11n-pose.yaml", 1e-5, (1e-5, 0.03)),
])
def test_converted_models_use_the_source_batch_norm_settings(tmp_path, kind, yaml, eps, want):
    import candle_nn as cn
    import mlx.core as mx

    from candle_nn_models.yolo_checkpoint import load_model

    ref = _eps_matters(seeded(kind, yaml, nc=5), eps)
    src, out = tmp_path / "best.pt", tmp_path / "best.safetensors"
    torch.save({"model": ref, "ema": None}, src)
    assert main(["convert", "--from", "ultralytics", str(src), str(out)]) == 0
    extra = read_metadata(out).extra
    assert (float(extra["candle_nn.bn_eps"]), float(extra["candle_nn.bn_momentum"])) == want

    x = np.random.default_rng(0).uniform(size=(1, 64, 96, 3)).astype(np.float32)
    want32, want64 = _reference(ref, x, torch.float32), _reference(ref, x, torch.float64)
    tol = tolerance(want32, want64)
    saved = tmp_path / "saved.safetensors"
    for path in (out, saved):  # the converted file, then the loaded model saved again
        model = load_model(cn.VarBuilder.from_safetensors(str(path), device="cpu"))
        got = model(mx.array(x))
        got = np.array(got[0] if isinstance(got, tuple) else got)  # segment: (pred, protos)
        err = np.abs(got - want32).max() / np.abs(want64).max()
        assert got.shape == want32.shape and err <= tol, (path.name, err, tol)
        if path == out:
            cn.save_safetensors(model, saved)
    assert float(read_metadata(saved).extra["candle_nn.bn_eps"]) == want[0]


def test_a_file_without_settings_keeps_the_model_defaults_and_bad_ones_are_refused(tmp_path):
    import candle_nn as cn
    from safetensors.numpy import save_file

    tensors = {"bn.running_mean": np.zeros(2, np.float32), "bn.running_var": np.ones(2, np.float32),
               "bn.weight": np.ones(2, np.float32), "bn.bias": np.zeros(2, np.float32)}
    path = tmp_path / "bn.safetensors"
    save_file(tensors, str(path))
    bn = cn.BatchNorm2d.load(cn.VarBuilder.from_safetensors(str(path)).pp("bn"), 2, 1e-3, 0.03)
    assert (bn.eps, bn.momentum) == (1e-3, 0.03)
    save_file(tensors, str(path), metadata={"candle_nn.bn_eps": "1e-5"})
    bn = cn.BatchNorm2d.load(cn.VarBuilder.from_safetensors(str(path)).pp("bn"), 2, 1e-3, 0.03)
    assert (bn.eps, bn.momentum) == (1e-5, 0.03)
    save_file(tensors, str(path), metadata={"candle_nn.bn_eps": "nan"})
    with pytest.raises(cn.WeightsFileError, match="candle_nn.bn_eps = 'nan' is not a number"):
        cn.BatchNorm2d.load(cn.VarBuilder.from_safetensors(str(path)).pp("bn"), 2)


def test_mobile_sam_encoder_uses_the_source_batch_norm_eps(tmp_path):
    """TinyViT (MobileSAM's encoder, PyTorch's eps 1e-5) against MobileSAM's own model on the
    fixture weights with eps-sensitive BatchNorm statistics, through --from mobile_sam."""
    import candle_nn as cn
    import mlx.core as mx
    from benchmarks.mobile_sam_reference import build_reference_sam
    from conftest import load_fixture

    from candle_nn_models.segment_anything import Sam

    ref = build_reference_sam(load_fixture("mobile_sam")[2] / "weights.safetensors")
    _eps_matters(ref.image_encoder)
    ref.eval()  # TinyViT re-gathers its attention-bias cache
    src, out = tmp_path / "mobile_sam.pt", tmp_path / "mobile_sam.safetensors"
    torch.save(ref.state_dict(), src)
    assert main(["convert", "--from", "mobile_sam", str(src), str(out)]) == 0
    assert float(read_metadata(out).extra["candle_nn.bn_eps"]) == 1e-5

    x = np.random.default_rng(0).standard_normal((1, 1024, 1024, 3)).astype(np.float32)
    want32 = _reference(ref.image_encoder, x, torch.float32).transpose(0, 2, 3, 1)
    want64 = _reference(ref.image_encoder, x, torch.float64).transpose(0, 2, 3, 1)
    sam = Sam.load(cn.VarBuilder.from_safetensors(str(out), device="cpu"))
    got = np.array(sam.image_encoder(mx.array(x)))
    err = np.abs(got - want32).max() / np.abs(want64).max()
    assert got.shape == want32.shape and err <= tolerance(want32, want64), err


class _TorchResNet18(torch.nn.Module):
    """torchvision's ResNet-18 (its module names), written here: torchvision is not installed."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        cin = 64
        for index, width in enumerate((64, 128, 256, 512)):
            blocks = []
            for i in range(2):
                stride = 2 if i == 0 and index > 0 else 1
                block = nn.Module()
                block.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
                block.bn1 = nn.BatchNorm2d(width)
                block.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
                block.bn2 = nn.BatchNorm2d(width)
                if stride != 1 or cin != width:
                    block.downsample = nn.Sequential(nn.Conv2d(cin, width, 1, stride, bias=False),
                                                     nn.BatchNorm2d(width))
                blocks.append(block)
                cin = width
            setattr(self, f"layer{index + 1}", nn.Sequential(*blocks))
        self.fc = nn.Linear(512, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        relu = torch.relu
        x = torch.nn.functional.max_pool2d(relu(self.bn1(self.conv1(x))), 3, 2, 1)
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            for b in layer:
                skip = b.downsample(x) if hasattr(b, "downsample") else x
                x = relu(b.bn2(b.conv2(relu(b.bn1(b.conv1(x))))) + skip)
        return self.fc(x.mean(dim=(2, 3)))


def test_resnet_uses_the_source_batch_norm_eps(tmp_path):
    """ResNet-18 (torchvision's eps 1e-5) on the fixture weights with eps-sensitive statistics,
    through --from torchvision, against the same network in torch."""
    import candle_nn as cn
    import mlx.core as mx
    from conftest import load_fixture
    from safetensors.numpy import load_file

    from candle_nn_models.resnet import ResNet

    ref = _TorchResNet18().eval()
    weights = load_file(str(load_fixture("resnet18")[2] / "weights.safetensors"))
    missing, unexpected = ref.load_state_dict(
        {k: torch.from_numpy(v.astype(np.float32)) for k, v in weights.items()}, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), missing
    _eps_matters(ref)
    src, out = tmp_path / "resnet18.pth", tmp_path / "resnet18.safetensors"
    torch.save(ref.state_dict(), src)
    assert main(["convert", "--from", "torchvision", str(src), str(out)]) == 0
    assert float(read_metadata(out).extra["candle_nn.bn_eps"]) == 1e-5

    x = np.random.default_rng(0).standard_normal((2, 64, 64, 3)).astype(np.float32)
    want32, want64 = _reference(ref, x, torch.float32), _reference(ref, x, torch.float64)
    model = ResNet.load(cn.VarBuilder.from_safetensors(str(out), device="cpu"), "resnet18")
    got = np.array(model(mx.array(x)))
    err = np.abs(got - want32).max() / np.abs(want64).max()
    assert got.shape == want32.shape and err <= tolerance(want32, want64), err
