"""``python -m benchmarks.bench_layers``: ours per Conv2d / Linear module against ONNX Runtime's
nodes. Structure only (no timing assertions); ONNX Runtime may be absent from this venv."""

from __future__ import annotations

from benchmarks import bench_layers
from benchmarks.bench_models import MODELS


def test_resnet_nodes_map_to_our_layers() -> None:
    assert bench_layers.resnet_layer("/layer2/layer2.0/relu_1/Relu") == "stages.1.0.convs.1"
    assert bench_layers.resnet_layer("/layer2/layer2.3/relu/Relu") == "stages.1.3.convs.0"
    assert bench_layers.resnet_layer("/layer4/layer4.2/conv3/Conv") == "stages.3.2.convs.2"
    assert bench_layers.resnet_layer(
        "/layer1/layer1.0/downsample/downsample.0/Conv") == "stages.0.0.downsample"
    assert bench_layers.resnet_layer("/relu/Relu") == "stem"
    assert bench_layers.resnet_layer("/fc/Gemm") == "fc"
    assert bench_layers.resnet_layer("/maxpool/MaxPool") is None


def test_every_conv_and_linear_is_timed_and_matched(tmp_path) -> None:
    ours = bench_layers.ours_layers(MODELS["resnet18"], 1, 1, str(tmp_path))
    # ResNet-18: the stem, 8 blocks x 2 convs, 3 downsamples, fc
    assert len(ours) == 21 and all(ms > 0 for _, ms in ours.values())
    assert ours["stem"][0] == "Conv2d 7x7/s2" and ours["fc"][0] == "Linear"
    ort = {"/relu/Relu": ("Conv", 2.0), "/layer1/layer1.0/relu/Relu": ("Conv", 1.0),
           "/maxpool/MaxPool": ("MaxPool", 0.5)}
    text = bench_layers.table(ours, ort, resnet=True)
    stem = next(line for line in text.splitlines() if line.startswith("| stem |"))
    assert stem.endswith(f"| 2.00 | {ours['stem'][1] / 2.0:.2f} |")
    assert "| MaxPool | 0.50 |" in text and f"| total | {sum(ms for _, ms in ours.values()):.2f}" \
        in text


def test_command_line_prints_the_table(capsys) -> None:
    assert bench_layers.main(["--model", "resnet18", "--repeat", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("resnet18, batch 1, threads 1; ") and "| stages.3.1.convs.1 |" in out


def test_cold_times_every_layer_and_says_so(capsys) -> None:
    assert bench_layers.main(["--model", "resnet18", "--repeat", "1", "--threads", "1",
                              "--cold"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("resnet18, batch 1, threads 1, ours cold; ")
    assert "| stem |" in out and "| stages.3.1.convs.1 |" in out
