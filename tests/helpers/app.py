"""``candle-nn-app`` for the tests: started as a user starts it (a child process through the console
entry point, on the fixture weights and a free port), a headless Chromium from the system's
packages driven by Selenium (nothing downloaded: the test fails when the browser is missing), and
the models the app serves, loaded here too, to compute what its answers must be."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from candle_nn import config

from conftest import ROOT, fixture_dir
from helpers.cli import cli_command, cli_env

START_TIMEOUT_S = 300  # loading four models on a busy 2-core machine


def weights_args() -> list[str]:
    """The app's ``--*-weights`` options on the fixtures' (random, seeded) weights."""
    return ["--sam-weights", str(fixture_dir("mobile_sam") / "weights.safetensors"),
            "--detect-weights", str(fixture_dir("yolov8n") / "weights.safetensors"),
            "--pose-weights", str(fixture_dir("yolov8n_pose") / "weights.safetensors"),
            "--classify-weights", str(fixture_dir("resnet18") / "weights.safetensors")]


@contextmanager
def running_app(*args: str) -> Iterator[str]:
    """Start ``candle-nn-app`` on the CPU, the fixture weights, a free port and ``args``; its URL
    until the block ends (then it is stopped)."""
    command = cli_command("app", "--port", "0", "--device", "cpu", *weights_args(), *args)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(), cwd=ROOT)
    try:
        line = _serving_line(proc)
        yield line.split("serving on ", 1)[1].split()[0].rstrip("/")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _serving_line(proc: subprocess.Popen) -> str:
    import selectors
    import time

    deadline = time.monotonic() + START_TIMEOUT_S
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=1.0):
                line = proc.stdout.readline()
                if "serving on http://" in line:
                    return line
                if not line and proc.poll() is not None:
                    break
            elif proc.poll() is not None:
                break
    proc.kill()
    pytest.fail(f"candle-nn-app did not start: {proc.stderr.read()[-2000:]}")


def post(url: str, path: str, body: "dict | bytes", headers: dict | None = None,
         ) -> tuple[int, dict[str, Any]]:
    """``(status, JSON answer)`` of a POST (a dict is sent as JSON, bytes as they are)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method="POST",
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def get(url: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + path, timeout=60) as response:
        return json.load(response)


def chromium():
    """A headless Chromium (Debian's ``chromium`` + ``chromium-driver``) under Selenium."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.fail("the browser tests need Chromium and its driver from the system's packages: "
                    "apt-get install chromium chromium-driver (tests/system_setup.sh, the README "
                    "test command's first step, does this)")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never download a browser/driver
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1100,760", "--force-device-scale-factor=1", "--lang=en-US"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


def screenshot_dir(tmp_path: Path) -> Path:
    """Where the browser test saves its screenshots: ``$CANDLE_NN_APP_SCREENSHOTS`` (``docs``
    when refreshing the README's pictures), else ``tmp_path``."""
    folder = config.get("CANDLE_NN_APP_SCREENSHOTS")
    return Path(folder) if folder else tmp_path


@contextmanager
def serving(make_models, max_queue: int = 8, max_pixels: int = 10 ** 6,
            max_upload_bytes: int = 1 << 20, **server_options) -> Iterator[tuple[str, Any]]:
    """The app's server in this process, on 127.0.0.1 and a free port, with the models that
    ``make_models(sessions, stop_requested)`` builds (stand-ins: fast, and their calls visible
    to the test); ``(URL, App)`` until the block ends. ``server_options``: ``make_server``'s."""
    import threading

    from candle_nn_models.scripts.app_sample import sample_image
    from candle_nn_models.scripts.app_server import App, make_server, serve
    from candle_nn_models.scripts.app_sessions import Sessions
    from candle_nn_models.scripts.app_worker import ModelWorker

    server = make_server("127.0.0.1", 0, **server_options)
    worker = ModelWorker(max_queue)
    sessions = Sessions(4, 4, 2)
    app = App(make_models(sessions, worker.stop_requested), worker, sessions, sample_image(),
              max_pixels, max_upload_bytes)
    thread = threading.Thread(target=serve, args=(server, app), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", app
    finally:
        server.shutdown()
        server.server_close()
        worker.shutdown()
        thread.join(timeout=30)
