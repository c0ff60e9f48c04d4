"""candle-resnet as a new user would run it: good and bad inputs, one clear line on failure."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import FIXTURES, fixture_dir, one_error_line

import candle_nn as cn
from candle_nn import device as cn_device
from candle_nn_models.imagenet import class_names
from candle_nn_models.resnet import ResNet
from candle_nn_models.scripts.resnet import main

BIKE = str(FIXTURES / "images" / "bike.jpg")


@pytest.fixture(scope="module")
def weights():
    return str(fixture_dir("resnet18") / "weights.safetensors")


def _fails(capsys, argv, *fragments):
    assert main(argv) == 1
    return one_error_line(capsys, *fragments)


def test_one_image_prints_top_k(capsys, weights):
    assert main(["--image", BIKE, "--weights", weights, "--top-k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{BIKE}:" and len(lines) == 4
    rows = [line.rsplit(": ", 1) for line in lines[1:]]  # candle's `label: 12.34%`
    assert all(label.strip() in class_names() for label, _ in rows)
    probs = [float(percent.rstrip("%")) for _, percent in rows]
    assert probs == sorted(probs, reverse=True) and 0 < probs[0] <= 100


def test_folder_and_repeated_images_give_json(capsys, weights, tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for name in ("a.jpg", "b.jpg"):
        shutil.copy(BIKE, folder / name)
    (folder / "notes.txt").write_text("not an image, not picked from a folder")
    argv = ["--image", str(folder), "--image", BIKE, "--weights", weights, "--json",
            "--batch-size", "2"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == "resnet18" and len(doc["images"]) == 3
    tops = [tuple(e["index"] for e in img["top_k"]) for img in doc["images"]]
    assert tops[0] == tops[1] == tops[2]  # the same picture, batched or not
    total = sum(e["probability"] for e in doc["images"][0]["top_k"])
    assert 0 < total <= 1.0 + 1e-6


def test_missing_image(capsys, weights):
    _fails(capsys, ["--image", "no/such.jpg", "--weights", weights],
           "image not found", "no/such.jpg")


def test_non_image_file(capsys, weights, tmp_path):
    bogus = tmp_path / "photo.jpg"
    bogus.write_bytes(b"this is not a jpeg")
    _fails(capsys, ["--image", str(bogus), "--weights", weights], "not a readable image")


def test_empty_folder(capsys, weights, tmp_path):
    _fails(capsys, ["--image", str(tmp_path), "--weights", weights], "no image files")


@pytest.mark.parametrize("variant", ["resnet34", "resnet50"])
def test_weights_of_another_variant(capsys, weights, variant):
    _fails(capsys, ["--image", BIKE, "--weights", weights, "--variant", variant],
           f"holds resnet18 weights, not {variant}", "drop --variant")


def test_weights_of_another_model(capsys):
    other = str(fixture_dir("yolov8n") / "weights.safetensors")
    _fails(capsys, ["--image", BIKE, "--weights", other], "holds no ResNet")


def test_headless_weights_cannot_classify(capsys, tmp_path):
    varmap = cn.VarMap()
    ResNet.load(cn.VarBuilder.from_varmap(varmap, seed=0), "resnet18", num_classes=None)
    path = tmp_path / "headless.safetensors"
    varmap.save(path)
    _fails(capsys, ["--image", BIKE, "--weights", str(path)], "headless resnet18")


def test_custom_head_gets_numbered_labels(capsys, tmp_path):
    varmap = cn.VarMap()
    ResNet.load(cn.VarBuilder.from_varmap(varmap, seed=0), "resnet18", num_classes=3)
    path = tmp_path / "three.safetensors"
    varmap.save(path)
    assert main(["--image", BIKE, "--weights", str(path), "--json"]) == 0
    labels = {e["label"] for e in json.loads(capsys.readouterr().out)["images"][0]["top_k"]}
    assert labels == {"0", "1", "2"}


def test_missing_and_corrupt_weights(capsys, tmp_path, weights):
    _fails(capsys, ["--image", BIKE, "--weights", str(tmp_path / "none.safetensors")],
           "weights file not found")
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(open(weights, "rb").read()[:5000])
    _fails(capsys, ["--image", BIKE, "--weights", str(broken)], "broken.safetensors")


def test_offline_default_weights_say_what_to_download(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    _fails(capsys, ["--image", BIKE, "--variant", "resnet34"], "resnet34.safetensors", "--weights")


@pytest.mark.parametrize("gpus", ["this machine's", 2])
def test_a_gpu_the_machine_lacks(capsys, monkeypatch, weights, gpus):
    """`--device gpu:N` one past the GPUs there are (gpu:0 without a GPU, gpu:1 on a one-GPU
    machine; and with MLX's GPU count patched to 2, gpu:2) is one line saying what there is."""
    if gpus != "this machine's":
        monkeypatch.setattr(cn_device, "_gpu_count", lambda: gpus)
    count = cn_device._gpu_count()  # (Device.available() would intern fake GPU devices)
    have = "no GPU" if count == 0 else f"{count} GPU(s)"
    _fails(capsys, ["--image", BIKE, "--weights", weights, "--device", f"gpu:{count}"],
           f"gpu:{count} was requested", have)


def test_bad_numbers(capsys, weights):
    with pytest.raises(SystemExit) as exc:  # a usage error, as argparse's own
        main(["--image", BIKE, "--weights", weights, "--top-k", "0"])
    assert exc.value.code == 2 and "--top-k: 0 is not at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--image", BIKE, "--variant", "resnet19"])


def test_cli_results_match_the_model(capsys, weights):
    """The printed top-1 is the argmax of the model's logits on the preprocessed image."""
    import mlx.core as mx

    from candle_nn_models.imagenet import preprocess
    from candle_nn_models.scripts.common import load_rgb

    model = ResNet.load(cn.VarBuilder.from_safetensors(weights, device="cpu"), "resnet18")
    logits = np.array(model(mx.array(preprocess(load_rgb(BIKE))[None])))
    assert main(["--image", BIKE, "--weights", weights, "--top-k", "1"]) == 0
    label = capsys.readouterr().out.splitlines()[1].rsplit(": ", 1)[0].strip()
    assert label == class_names()[int(logits.argmax())]


def test_verbose_reports_the_runtime(capsys, weights):
    assert main(["--image", BIKE, "--weights", weights, "--top-k", "1", "--verbose"]) == 0
    err = capsys.readouterr().err
    assert "CPU BLAS" in err and "float32 precision" in err and "MLX" in err


def test_class_names_with_control_characters_are_escaped_in_text(capsys, tmp_path):
    """Labels from a file's metadata holding a colour escape, a newline and a carriage return
    print escaped, one line each; the JSON document keeps them exact."""
    names = ["\x1b[31mcat\nbike : 100.00%", "dog\r"]
    varmap = cn.VarMap()
    ResNet.load(cn.VarBuilder.from_varmap(varmap, device="cpu", seed=1), "resnet18",
                num_classes=2)
    weights = tmp_path / "hostile.safetensors"
    varmap.save(weights, metadata={"candle_nn.names": json.dumps(names)})
    assert main(["--image", BIKE, "--weights", str(weights), "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(line.isprintable() for line in lines), lines
    assert {line.rsplit(": ", 1)[0].strip() for line in lines[1:]} == {
        "\\x1b[31mcat\\nbike : 100.00%", "dog\\r"}
    assert main(["--image", BIKE, "--weights", str(weights), "--device", "cpu", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {e["label"] for e in doc["images"][0]["top_k"]} == set(names)
