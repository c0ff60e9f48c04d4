"""``python -m benchmarks.bench_app``: ``candle-nn-app``'s click → mask round trip.

Starts the app as a user does (a child process, ``--device``, MobileSAM on the fixture weights:
speed does not depend on the values), puts one image in it (the fixtures' ``bike.jpg``, 800x556,
else the app's sample) and computes its embedding once (``first embedding``: the encoder, the
one slow step). Then ``--clicks`` single-point prompts at seeded random places, each timed:

- ``http``: a client POSTs ``/api/segment`` and reads the JSON answer (three masks as PNG, their
  COCO RLE) — the server's whole share of a click; ``model`` is the server's own time inside it
  (prompt encoder, mask decoder, upsampling, encoding the answer).
- ``browser`` (when Debian's ``chromium`` and ``chromedriver`` and Selenium are installed): a
  headless Chromium clicks the page and the page measures from sending the prompt to the mask
  drawn on its canvas — what a user waits for after a click.
- ``predictor`` (CPU): the same clicks through ``SamPredictor.predict`` in this process, the
  model's share of the rows above.

Prints median, p90 and min per row; ``--json FILE`` keeps them.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.ours import ROOT, fixtures

WEIGHTS = {"--sam-weights": "mobile_sam", "--detect-weights": "yolov8n",
           "--pose-weights": "yolov8n_pose", "--classify-weights": "resnet18"}


def start_app(device: str) -> tuple[subprocess.Popen, str]:
    """The app on a free port, the fixture weights; ``(process, URL)``."""
    args = [a for flag, name in WEIGHTS.items()
            for a in (flag, str(fixtures() / name / "weights.safetensors"))]
    proc = subprocess.Popen([sys.executable, "-m", "candle_nn_models.scripts.app", "--port", "0",
                             "--device", device, *args], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)
    for line in proc.stdout:
        if "serving on " in line:
            return proc, line.split("serving on ", 1)[1].split()[0].rstrip("/")
    raise SystemExit(f"candle-nn-app did not start (exit status {proc.wait()})")


def post(url: str, path: str, body: "dict | bytes") -> dict:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(url + path, data=data, method="POST"),
                                timeout=600) as response:
        return json.load(response)


def image_file() -> Path | None:
    path = fixtures() / "images" / "bike.jpg"
    return path if path.is_file() else None


def clicks(width: int, height: int, n: int, seed: int = 0) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    return [[float(rng.integers(5, width - 5)), float(rng.integers(5, height - 5))]
            for _ in range(n)]


def bench_http(url: str, n: int) -> dict:
    path = image_file()
    if path is not None:
        answer = post(url, "/api/upload", path.read_bytes())
    else:
        answer = post(url, "/api/sample", {})
    ids = {"session": answer["session"], "image": answer["image"]}
    start = time.perf_counter()
    post(url, "/api/embed", ids)
    first_s = time.perf_counter() - start
    walls, model = [], []
    for point in clicks(answer["width"], answer["height"], n):
        start = time.perf_counter()
        out = post(url, "/api/segment", {**ids, "points": [point], "labels": [1]})
        walls.append(1e3 * (time.perf_counter() - start))
        base64.b64decode(out["masks"][out["best"]]["png"])
        model.append(out["ms"])
    return {"image": f"{answer['width']}x{answer['height']}", "first_embedding_s": first_s,
            "http": summary(walls), "model": summary(model)}


def bench_browser(url: str, n: int) -> dict | None:
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait
    except ImportError:
        return None
    if not browser or not driver:
        return None
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1100,1100"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        def until(script: str):
            try:
                return WebDriverWait(chrome, 300, poll_frequency=0.02).until(
                    lambda d: d.execute_script(f"return ({script});"))
            except TimeoutException:
                message = chrome.execute_script(
                    "return document.getElementById('message').textContent")
                raise SystemExit(f"the page did not answer; its message: {message!r}") from None

        chrome.get(url + "/")
        until("window.candleApp && window.candleApp.info")
        path = image_file()
        if path is not None:
            chrome.find_element(By.ID, "file").send_keys(str(path))
        else:
            chrome.find_element(By.ID, "sample").click()
        until("document.getElementById('message').textContent.includes('embedding ready')")
        marks = chrome.find_element(By.ID, "marks")
        size = marks.size
        width, height, bottom, view = chrome.execute_script(
            "const r = document.getElementById('marks').getBoundingClientRect(); "
            "return [window.candleApp.width, window.candleApp.height, r.bottom, "
            "window.innerHeight]")
        if bottom > view:  # the driver would scroll, and the clicks land off their pixels
            raise SystemExit(f"the image does not fit the browser window ({bottom} > {view} px)")
        times = []
        for k, (x, y) in enumerate(clicks(width, height, n), 1):
            ActionChains(chrome).move_to_element_with_offset(
                marks, round(x * size["width"] / width - size["width"] / 2),
                round(y * size["height"] / height - size["height"] / 2)).click().perform()
            until(f"window.candleApp.answered >= {k} && window.candleApp.pending === 0")
            times.append(chrome.execute_script("return window.candleApp.roundTripMs"))
        return summary(times)
    finally:
        chrome.quit()


def bench_predictor(n: int) -> dict:
    """The same clicks through :meth:`SamPredictor.predict` in this process (no HTTP, no mask
    encoding): the model's share, to read the app's overhead off the rows above it."""
    from candle_nn import Device
    from candle_nn_models.scripts.app_sample import sample_image
    from candle_nn_models.scripts.common import load_rgb
    from candle_nn_models.scripts.segment_anything import load_sam
    from candle_nn_models.segment_anything import SamPredictor

    sam, _, _ = load_sam(None, fixtures() / "mobile_sam" / "weights.safetensors",
                         Device.parse("cpu"))
    predictor = SamPredictor(sam)
    path = image_file()
    rgb = load_rgb(path) if path is not None else sample_image()
    predictor.set_image(rgb)
    times = []
    for point in clicks(rgb.shape[1], rgb.shape[0], n):
        start = time.perf_counter()
        predictor.predict(point_coords=np.array([point], np.float32),
                          point_labels=np.array([1], np.int32), multimask_output=True)
        times.append(1e3 * (time.perf_counter() - start))
    return summary(times)


def summary(ms: list[float]) -> dict:
    ordered = sorted(ms)
    return {"median_ms": statistics.median(ordered),
            "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "min_ms": ordered[0], "n": len(ordered)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_app",
                                     description="candle-nn-app's click -> mask round trip")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clicks", type=int, default=30, help="timed clicks per row")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    proc, url = start_app(args.device)
    try:
        result = {"device": args.device, **bench_http(url, args.clicks)}
        print(json.dumps(result), flush=True)
        result["browser"] = bench_browser(url, args.clicks)
    finally:
        proc.terminate()
        proc.wait()
    if args.device == "cpu":
        result["predictor"] = bench_predictor(args.clicks)
    print(f"candle-nn-app on {args.device}, image {result['image']}: first embedding "
          f"{result['first_embedding_s']:.2f} s")
    rows = [("http (client POST -> JSON)", result["http"]),
            ("model (server's own time)", result["model"]),
            ("browser (prompt -> mask drawn)", result["browser"]),
            ("SamPredictor.predict alone", result.get("predictor"))]
    print(f"{'click -> mask':32} {'median ms':>10} {'p90 ms':>8} {'min ms':>8}")
    for name, row in rows:
        if row is None:
            print(f"{name:32} {'(not measured)':>28}")
        else:
            print(f"{name:32} {row['median_ms']:10.1f} {row['p90_ms']:8.1f} {row['min_ms']:8.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
