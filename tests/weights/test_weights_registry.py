"""Registry, downloads and metadata. Nothing is downloaded: offline paths and fakes only."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from candle_nn import WeightsFileError
from conftest import load_fixture, one_error_line
from candle_nn_models.weights import registry
from candle_nn_models.weights.cli import main
from candle_nn_models.weights.metadata import NAMES, WeightsMetadata, read_metadata
from candle_nn_models.weights.registry import (CHECKPOINTS, WeightsUnavailableError, download,
                                               resolve_weights)
from candle_nn_models.weights.spec import MOBILE_SAM_ENCODERS, SPECS, expected_tensors


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1 with an empty HF_HOME (also patched into huggingface_hub's constants,
    which it reads at import time)."""
    from huggingface_hub import constants

    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    return home


def test_offline_without_cache_says_which_file_and_where_to_pass_it(offline_hub):
    with pytest.raises(WeightsUnavailableError) as info:
        resolve_weights("yolo_v8", "s")
    message = str(info.value)
    assert "offline mode (HF_HUB_OFFLINE)" in message
    assert "https://huggingface.co/lmz/candle-yolo-v8/resolve/main/yolov8s.safetensors" in message
    assert "--weights PATH" in message
    assert not any(offline_hub.rglob("*.safetensors"))


def test_cli_download_offline_is_one_error_line(offline_hub, capsys):
    assert main(["download", "resnet", "resnet50"]) == 1
    assert "resnet50.safetensors" in one_error_line(capsys)


def test_explicit_weights_path_wins_even_offline(offline_hub, tmp_path):
    path = load_fixture("yolov8n")[2] / "weights.safetensors"
    assert resolve_weights("yolo_v8", "n", path) == path
    assert resolve_weights("no_such_model", "?", str(path)) == path
    with pytest.raises(WeightsFileError, match="not found"):
        resolve_weights("yolo_v8", "n", tmp_path / "missing.safetensors")


def test_missing_huggingface_hub_names_the_package_and_the_file(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import raises ImportError
    with pytest.raises(WeightsUnavailableError, match=r"huggingface_hub is not installed.*"
                       r"pip install huggingface_hub.*mobile_sam-tiny-vitt\.safetensors"):
        resolve_weights("mobile_sam", "tiny")


def test_unknown_model_and_variant(capsys):
    with pytest.raises(WeightsUnavailableError, match="known variants: l, m, n, s, x"):
        resolve_weights("yolo_v8", "q")
    with pytest.raises(WeightsUnavailableError, match="unknown model 'yolo'"):
        resolve_weights("yolo", "n")
    assert main(["download", "resnet", "resnet19"]) == 1
    assert "resnet18, resnet34" in one_error_line(capsys)


def test_download_uses_the_hub_cache_and_checks_the_file(monkeypatch, tmp_path):
    import huggingface_hub

    small = tmp_path / "yolov8n.safetensors"
    save_file({"a": np.zeros(2, np.float32)}, str(small))
    calls = []

    def fake_download(repo_id, filename, **kwargs):
        calls.append((repo_id, filename, kwargs))
        return str(fixture if filename == "yolov8n.safetensors" else small)

    fixture = load_fixture("yolov8n")[2] / "weights.safetensors"
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    assert download("yolo_v8", "n") == fixture
    assert calls[0][:2] == ("lmz/candle-yolo-v8", "yolov8n.safetensors")
    with pytest.raises(WeightsFileError, match=r"holds 1 tensors, yolo_v8 s needs 298.*--force"):
        download("yolo_v8", "s")


# Tensors in candle's published files (counted in the files on the hub): the counts the registry
# derives by building our models must be these.
PUBLISHED_TENSORS = {
    **{("resnet", f"resnet{d}"): n for d, n in ((18, 102), (34, 182), (50, 267), (101, 522),
                                                  (152, 777))},
    **{("yolo_v8", s): n for s, n in zip("nsmlx", (298, 298, 398, 498, 498))},
    **{("yolo_v8_pose", s): n + 36 for s, n in zip("nsmlx", (298, 298, 398, 498, 498))},
    ("mobile_sam", "tiny"): 408, ("sam", "vit_b"): 314,
}


def test_registry_lists_the_published_files_with_the_counts_of_our_models():
    assert {key: entry.tensors for key, entry in CHECKPOINTS.items()} == PUBLISHED_TENSORS


@pytest.mark.parametrize("fixture, key", [("resnet18", ("resnet", "resnet18")),
                                          ("yolov8n", ("yolo_v8", "n")),
                                          ("yolov8n_pose", ("yolo_v8_pose", "n")),
                                          ("mobile_sam", ("mobile_sam", "tiny"))])
def test_registry_tensor_counts_match_the_reference_files(fixture, key):
    """The model reads that many tensors, all of them in the reference file (MobileSAM's also
    holds TinyViT's unused classifier: norm_head and head, 4 tensors)."""
    path = load_fixture(fixture)[2] / "weights.safetensors"
    with safe_open(str(path), "numpy") as f:
        names = set(f.keys())
    read = set(expected_tensors(*key))
    assert CHECKPOINTS[key].tensors == len(read) and read <= names
    assert len(names - read) == (4 if fixture == "mobile_sam" else 0)


def test_variants_come_from_the_models_tables():
    from candle_nn_models.resnet import VARIANTS
    from candle_nn_models.segment_anything import TINY_VIT_CONFIGS, VIT_CONFIGS
    from candle_nn_models.yolo_v8 import MULTIPLES
    from candle_nn_models.scripts.segment_anything import MODELS as SAM_CLI_MODELS

    assert SPECS["resnet"].variants == tuple(VARIANTS)
    assert SPECS["yolo_v8"].variants == SPECS["yolo_v8_pose"].variants == tuple(MULTIPLES)
    assert SPECS["sam"].variants == tuple(VIT_CONFIGS) == ("vit_b", "vit_l", "vit_h")
    assert set(MOBILE_SAM_ENCODERS.values()) <= set(TINY_VIT_CONFIGS)
    assert SAM_CLI_MODELS == SPECS["mobile_sam"].variants + SPECS["sam"].variants
    for variant in ("vit_l", "vit_h"):  # known to inspect/convert, but candle publishes no file
        assert len(expected_tensors("sam", variant)) > len(expected_tensors("sam", "vit_b"))
        with pytest.raises(WeightsUnavailableError, match=f"candle publishes no sam {variant} "
                           r"checkpoint \(published: vit_b\).*--weights PATH"):
            resolve_weights("sam", variant)


def test_list_shows_every_checkpoint(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for entry in CHECKPOINTS.values():
        assert f"{entry.repo_id}/{entry.filename}" in out


def test_metadata_round_trip(tmp_path):
    meta = WeightsMetadata(model="yolo_v8", variant="s", task="detect", num_classes=2,
                           names=["cat", "dög"], source="ultralytics:best.pt")
    path = tmp_path / "m.safetensors"
    save_file({"x": np.zeros(1, np.float32)}, str(path), metadata=meta.to_dict())
    back = read_metadata(path)
    assert back == meta
    assert WeightsMetadata.from_dict({NAMES: '{"1": "b", "0": "a"}'}).names == ["a", "b"]
    assert WeightsMetadata.from_dict({NAMES: "not json"}).names is None
    assert read_metadata(load_fixture("resnet18")[2] / "weights.safetensors") == WeightsMetadata()


def test_registry_module_keeps_resolve_weights_signature():
    import inspect

    params = list(inspect.signature(registry.resolve_weights).parameters)
    assert params == ["model", "variant", "path"]


def test_no_network_fails_at_once_without_retries(monkeypatch, tmp_path, capsys):
    """Not in offline mode, nothing cached, and the hub's name does not resolve: one clear error
    straight away instead of huggingface_hub's minute of retries."""
    import socket

    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    network_calls = []
    real = huggingface_hub.hf_hub_download

    def spy(*args, **kwargs):
        if not kwargs.get("local_files_only"):
            network_calls.append(args)
        return real(*args, **kwargs)

    def no_dns(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", spy)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with pytest.raises(WeightsUnavailableError, match=r"cannot be resolved.*--weights PATH"):
        download("resnet", "resnet50")
    assert network_calls == []
