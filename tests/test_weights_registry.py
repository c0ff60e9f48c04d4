"""Registry, downloads and metadata. Nothing is downloaded: offline paths and fakes only."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

from candle_nn import WeightsFileError
from conftest import load_fixture
from weights import registry
from weights.cli import main
from weights.metadata import NAMES, WeightsMetadata, read_metadata
from weights.registry import CHECKPOINTS, WeightsUnavailableError, download, resolve_weights
from weights.spec import expected_tensors


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


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


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
    assert "resnet50.safetensors" in _one_error_line(capsys)


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
    assert "resnet18, resnet34" in _one_error_line(capsys)


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


@pytest.mark.parametrize("key", sorted(CHECKPOINTS), ids=lambda k: "-".join(k))
def test_registry_tensor_counts_match_the_models(key):
    entry = CHECKPOINTS[key]
    assert entry.tensors == len(expected_tensors(entry.model, entry.variant))


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
