"""``candle-nn-app`` against clients that misbehave, in this process on 127.0.0.1 with stand-in
models (``helpers.sam_decoder_stand_in``: fast, and their calls counted): an abandoned "segment
everything" stops, uploads decode a few at a time, stalled connections time out and are bounded,
odd JSON is a 400 with one message, and clients hanging up leave the server's output quiet."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from candle_nn import Device
from conftest import fixture_dir
from helpers.app import get, post, serving

POINTS_PER_SIDE, POINTS_PER_BATCH = 64, 16  # 256 batches: ~10 s of stand-in decoding


@pytest.fixture(scope="module")
def stand_in_sam():
    """The fixture's MobileSAM with its encoder and decoder stood in; ``decodes`` counts the
    point batches decoded."""
    from helpers.sam_decoder_stand_in import install_on_ours
    from candle_nn_models.segment_anything import Sam
    import candle_nn as cn

    sam = Sam.load(cn.VarBuilder.from_safetensors(
        fixture_dir("mobile_sam") / "weights.safetensors", device=Device.parse("cpu")))
    install_on_ours(sam)
    grid_decoder, decodes = sam.point_grid_decoder, []

    def counting(features):
        decoder = grid_decoder(features)
        decode = decoder.decode
        decoder.decode = lambda coords: decodes.append(len(coords)) or decode(coords)
        return decoder

    sam.point_grid_decoder = counting
    return sam, decodes


def sam_only(sam):
    """``make_models`` for :func:`helpers.app.serving`: the app's models with SAM alone (detect
    and classify are refused before they would run a model)."""
    from candle_nn_models.scripts.app_models import AppModels
    from candle_nn_models.segment_anything import SamPredictor

    class SamOnly(AppModels):
        def __init__(self, sessions, stop_requested) -> None:
            self.sam, self.predictor, self.sam_weights = sam, SamPredictor(sam), "stand-in"
            self.sessions, self.stop_requested = sessions, stop_requested
            # detect's checks need the class count only: a valid request would fail here
            self.detectors = {"detect": SimpleNamespace(spec=SimpleNamespace(num_classes=80))}

        def info(self) -> dict:
            return {}

    return SamOnly


class NoModels:
    """``make_models`` for requests that need no model: every job answers ``{}`` at once."""

    def __init__(self, sessions, stop_requested) -> None:
        self.sessions = sessions
        self.embed = self.segment = self.everything = self.detect = self.classify = (
            lambda *args: {})

    def info(self) -> dict:
        return {}


def raw_request(url: str, method: str, path: str, body: bytes = b"",
                length: int | None = None) -> socket.socket:
    """A connection that has sent a request (``length``: the Content-Length it claims)."""
    host, port = url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=30)
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n\r\n")
    conn.sendall(head.encode() + body)
    return conn


def reset(conn: socket.socket) -> None:
    """Hang up at once, with a TCP reset (as a browser tab that is killed)."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
    conn.close()


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s} s")
        time.sleep(0.05)


def test_an_abandoned_everything_is_stopped(stand_in_sam, capfd):
    """A visitor starts "segment everything" (256 batches of points) and closes the page: the
    run stops within a few batches, so the next visitor is served at once; a job still queued
    when its page closes never runs. Nothing is printed."""
    sam, decodes = stand_in_sam
    with serving(sam_only(sam)) as (url, app):
        status, image = post(url, "/api/sample", {})
        assert status == 200, image
        request = json.dumps({"session": image["session"], "image": image["image"],
                              "points_per_side": POINTS_PER_SIDE,
                              "points_per_batch": POINTS_PER_BATCH}).encode()
        batches = (POINTS_PER_SIDE ** 2) // POINTS_PER_BATCH
        decodes.clear()
        conn = raw_request(url, "POST", "/api/everything", request)
        wait_for(lambda: len(decodes) >= 3, 60, "segment everything did not start")
        conn.close()
        wait_for(lambda: app.worker.pending == 0, 10, "the abandoned run kept the worker")
        stopped_at = len(decodes)
        assert stopped_at < batches // 4, (stopped_at, batches)
        status, answer = post(url, "/api/embed", {"session": image["session"],
                                                  "image": image["image"]})
        assert status == 200, answer
        time.sleep(0.5)
        assert len(decodes) == stopped_at  # it does not resume either

        # queued behind another job, then abandoned: dropped without running
        release = threading.Event()
        blocker = threading.Thread(target=app.worker.run, args=(release.wait,))
        blocker.start()
        wait_for(lambda: app.worker.pending == 1, 10, "the blocking job did not start")
        conn = raw_request(url, "POST", "/api/everything", request)
        wait_for(lambda: app.worker.pending == 2, 10, "the request did not queue")
        conn.close()
        wait_for(lambda: app.worker.pending == 1, 10, "the abandoned job stayed queued")
        release.set()
        blocker.join()
        wait_for(lambda: app.worker.pending == 0, 10, "the worker did not empty")
        assert len(decodes) == stopped_at
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "error" not in err, err


def test_uploads_are_decoded_a_few_at_a_time(monkeypatch):
    """Six uploads at once: at most ``DECODE_SLOTS`` decode together (each briefly needs
    several times its RGB size), and every one is answered."""
    from candle_nn_models.scripts import app_server

    lock, running, most = threading.Lock(), [0], [0]
    decode = app_server.decode_rgb

    def slow_decode(*args, **kwargs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            time.sleep(0.3)
            return decode(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(app_server, "decode_rgb", slow_decode)
    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, format="PNG")
    with serving(NoModels) as (url, _):
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: post(url, "/api/upload", buf.getvalue()), range(6)))
    assert [status for status, _ in answers] == [200] * 6, answers
    assert most[0] == app_server.DECODE_SLOTS == 2


def test_stalled_connections_time_out_and_are_bounded(capfd):
    """Six connections that send half a request and stall, against a server of 3 connections
    and a 2 s timeout: three are answered 503 at once, the other three hold at most three
    threads and are closed after the timeout; then the server answers as before, quietly.
    (2 s: the six connect well within it, even on a busy machine.)"""
    with serving(NoModels, max_connections=3, timeout_s=2.0) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        conns = []
        for _ in range(6):
            conn = socket.create_connection((host, int(port)), timeout=10)
            conn.sendall(b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line
            conns.append(conn)
            time.sleep(0.05)  # accepted in this order
        handlers = [t for t in threading.enumerate() if "process_request_thread" in t.name]
        assert len(handlers) <= 3, len(handlers)
        started = time.monotonic()
        answers = []
        for conn in conns:
            data = b""
            while chunk := conn.recv(4096):
                data += chunk
            answers.append((data.split(b"\r\n", 1)[0], time.monotonic() - started))
            conn.close()
        assert [a for a, _ in answers] == [b""] * 3 + [b"HTTP/1.1 503 Service Unavailable"] * 3
        assert all(seconds < 10 for _, seconds in answers), answers
        assert get(url, "/api/status")["queued"] == 0
    out, err = capfd.readouterr()
    assert err == "", err


@pytest.mark.parametrize("route,body", [
    ("/api/segment", b"[" * 200_000),
    ("/api/segment", b'{"session": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b"}"),
])
def test_deeply_nested_json_is_one_message(route, body):
    with serving(NoModels) as (url, _):
        status, answer = post(url, route, body)
    assert (status, set(answer)) == (400, {"error"}), answer
    assert "nested too deeply" in answer["error"], answer


def test_odd_json_values_are_400s(stand_in_sam, capfd):
    """Every field of every model request given an object, a nested list, a list of the wrong
    type, an empty string or a boolean: each answer is a 400 with one message (a detect
    ``task`` that is a list or an object was a 500)."""
    sam, _ = stand_in_sam
    odd = [{"a": 1}, [[1, [2]]], [["x"]], [{"a": []}], [1.5], "", True]
    fields = {"/api/segment": ("points", "labels", "box"),
              "/api/everything": ("points_per_side", "pred_iou_thresh", "crop_n_layers"),
              "/api/detect": ("task", "conf", "iou", "classes"), "/api/classify": ("top_k",)}
    with serving(sam_only(sam)) as (url, _):
        _, image = post(url, "/api/sample", {})
        ids = {"session": image["session"], "image": image["image"]}
        prompt = {"points": [[1, 1]], "labels": [1]}  # a valid one, but for the odd field
        requests = [(route, {**ids, **(prompt if route == "/api/segment" else {}), key: value})
                    for route, keys in fields.items() for key in keys for value in odd]
        requests += [("/api/segment", {**ids, **prompt, key: value})
                     for key in ("session", "image") for value in odd]
        answers = [(route, request, *post(url, route, request)) for route, request in requests]
    bad = [a for a in answers if (a[2], set(a[3])) != (400, {"error"})]
    assert not bad, bad[:5]
    out, err = capfd.readouterr()
    assert "error" not in err, err


def test_clients_hanging_up_leave_the_output_quiet(capfd):
    """Clients that reset the connection mid-headers, mid-upload, right after asking for the
    page, or while a model job runs: no traceback, no line at all, and the server goes on."""
    with serving(NoModels) as (url, app):
        host, port = url.removeprefix("http://").split(":")
        for _ in range(5):
            conn = socket.create_connection((host, int(port)), timeout=10)
            conn.sendall(b"POST /api/upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
            time.sleep(0.05)
            reset(conn)
            conn = raw_request(url, "POST", "/api/upload", b"\x89PNG" * 10, length=100_000)
            time.sleep(0.05)
            reset(conn)
            reset(raw_request(url, "GET", "/"))
            conn = raw_request(url, "GET", "/")
            conn.shutdown(socket.SHUT_WR)
            reset(conn)
        # a model request queued behind a running job, its client resetting while it waits,
        # the job ending then or a moment later
        _, image = post(url, "/api/sample", {})
        body = json.dumps({"session": image["session"], "image": image["image"]}).encode()
        for wait in (0.0, 0.5):
            release = threading.Event()
            job = threading.Thread(target=app.worker.run, args=(release.wait, 10))
            job.start()
            conn = raw_request(url, "POST", "/api/classify", body)
            time.sleep(0.3)
            reset(conn)
            time.sleep(wait)
            release.set()
            job.join()
        assert get(url, "/api/status")["sessions"] == 1
    out, err = capfd.readouterr()
    assert err == "", err
