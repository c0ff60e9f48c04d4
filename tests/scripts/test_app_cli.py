"""``candle-nn-app`` as a new user meets it: ``--help``, and a wrong weights file, a taken port or
a bad sample image are one error line naming the option, exit status 1, nothing served."""

from __future__ import annotations

import socket

from conftest import error_line, fixture_dir
from helpers.app import weights_args
from helpers.cli import run_cli


def test_help_says_how_to_reach_it():
    result = run_cli("app", "--help", timeout=60)
    assert result.returncode == 0
    text = result.stdout.decode()
    for option in ("--host", "--port", "--sam-weights", "--detect-weights", "--pose-weights",
                   "--classify-weights", "--device", "--max-pixels", "--max-upload-mb",
                   "--max-sessions", "--max-embeddings", "--max-connections", "--timeout",
                   "127.0.0.1"):
        assert option in text, option


def test_wrong_weights_are_one_error_naming_the_option(tmp_path):
    args = weights_args()
    args[args.index("--detect-weights") + 1] = str(fixture_dir("resnet18") / "weights.safetensors")
    result = run_cli("app", "--port", "0", "--device", "cpu", *args)
    assert result.returncode == 1
    error_line(result.stderr, "not a YOLOv8 checkpoint", "--detect-weights")
    assert b"serving on" not in result.stdout

    args = weights_args()
    args[args.index("--sam-weights") + 1] = str(tmp_path / "missing.safetensors")
    result = run_cli("app", "--port", "0", "--device", "cpu", *args)
    assert result.returncode == 1
    error_line(result.stderr, "--sam-weights", "not found")


def test_taken_port_and_bad_sample_are_refused_before_the_models_load(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("app", "--port", str(port), "--device", "cpu", *weights_args(),
                         timeout=60)
    assert result.returncode == 1
    error_line(result.stderr, f"cannot listen on 127.0.0.1:{port}", "--port")

    bad = tmp_path / "sample.png"
    bad.write_bytes(b"not an image")
    result = run_cli("app", "--port", "0", "--sample", str(bad), *weights_args(), timeout=60)
    assert result.returncode == 1
    error_line(result.stderr, "sample.png", "not a readable image")
