"""``candle-nn-app``'s HTTP side: the standard library's ``ThreadingHTTPServer`` serving one static
page (``app_page.html``) and a small JSON API. Each request is parsed and checked on its own
thread; model work goes to the one model worker.

    GET  /                  the page
    GET  /api/info          models, class names, limits
    GET  /api/status        what the server holds (sessions, images, embeddings) and its queue
    POST /api/upload        body: the image file's bytes (X-Session: the session, if any)
    POST /api/sample        {"session"}: the sample image into the session
    POST /api/embed         {"session", "image"}: SAM's encoder on the image (the first prompt's
                            wait, taken when the page shows the image)
    POST /api/segment       {"session", "image", "points", "labels", "box", "multimask"}
    POST /api/everything    {"session", "image", <generator knobs>}
    POST /api/detect        {"session", "image", "task", "conf", "iou", "classes"}
    POST /api/classify      {"session", "image", "top_k"}

Every answer is JSON; a refused request is ``{"error": "<one line>"}`` with a 4xx/5xx status and
never a traceback. Uploads are bytes, never paths: the browser cannot name a file on the server.
"""

from __future__ import annotations

import io
import ipaddress
import json
import select
import socket
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import numpy as np

from candle_nn import CandleNNError
from candle_nn_models.image_decode import PixelLimitError, decode_rgb, unreadable_reason
from candle_nn_models.scripts.app_models import AppModels, image_jpeg
from candle_nn_models.scripts.app_sessions import Sessions
from candle_nn_models.scripts.app_worker import Abandoned, BusyError, ModelWorker
from candle_nn_models.scripts.common import ImageInputError

PAGE = Path(__file__).with_name("app_page.html")
MAX_JSON_BYTES = 1 << 20
MAX_DISCARD_BYTES = 256 << 20  # a refused upload up to this size is read, so its sender sees why
DECODE_SLOTS = 2  # uploads decoded at once (a 40 Mpx one needs ~0.5 GB while it decodes)
# Waiting on the model worker, a request checks this often whether its client has hung up
# (then a job still queued is dropped, and "segment everything" stops at its next batch).
CLIENT_POLL_S = 0.25
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; "
                               "style-src 'self' 'unsafe-inline'; "
                               "script-src 'self' 'unsafe-inline'",
}


class RequestError(CandleNNError):
    """A request the server refuses before any work: ``status`` and the message."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        self.status = status
        super().__init__(message)


class App:
    """The state every request handler shares."""

    def __init__(self, models: AppModels, worker: ModelWorker, sessions: Sessions,
                 sample: np.ndarray, max_pixels: int, max_upload_bytes: int) -> None:
        self.models, self.worker, self.sessions = models, worker, sessions
        self.sample, self.max_pixels, self.max_upload_bytes = sample, max_pixels, max_upload_bytes
        self.decode_slots = threading.BoundedSemaphore(DECODE_SLOTS)
        self.info = {**models.info(), "max_upload_bytes": max_upload_bytes,
                     "max_pixels": max_pixels}

    def add_image(self, session: str | None, rgb: np.ndarray) -> dict[str, Any]:
        session_id, image_id = self.sessions.add_image(session, rgb)
        return {"session": session_id, "image": image_id, "width": int(rgb.shape[1]),
                "height": int(rgb.shape[0]), "jpeg": image_jpeg(rgb)}

    def upload(self, session: str | None, data: bytes) -> dict[str, Any]:
        """Decode the upload with the CLIs' decoder (the same checks and messages), at most
        :data:`DECODE_SLOTS` at a time: each decode briefly needs several times the image's
        RGB size, so parallel uploads wait their turn instead of adding up."""
        with self.decode_slots:
            try:
                rgb = decode_rgb(io.BytesIO(data), self.max_pixels)
            except PixelLimitError as exc:
                raise ImageInputError("upload", f"{exc}; start the app with --max-pixels "
                                                f"{exc.width * exc.height}") from None
            except Exception as exc:  # Pillow's decoders raise many types on corrupt data
                raise ImageInputError("upload", unreadable_reason(exc)) from None
        return self.add_image(session, rgb)

    def status(self) -> dict[str, Any]:
        sessions = self.sessions
        limits = {"max_sessions": sessions.max_sessions, "max_images": sessions.max_images,
                  "max_embeddings": self.sessions.max_embeddings,
                  "max_queue": self.worker.max_queue}
        return {**self.sessions.counts(), "queued": self.worker.pending, "limits": limits}


class Server(ThreadingHTTPServer):
    """One thread per connection, at most ``max_connections`` at once (more are answered 503
    and closed at once); a connection silent for ``timeout_s`` (headers, body, or idle between
    requests) is closed, so stalled clients cannot hold threads for ever."""

    daemon_threads = True
    # socketserver's default backlog is 5: a burst of visitors' requests beyond it would be reset
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type, max_connections: int) -> None:
        super().__init__(address, handler)
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            _refuse(request, self.max_connections)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: its slot is free again
            self._slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: socket.socket, client_address: Any) -> None:
        """A client that hung up or went silent is no error of ours: nothing printed. Anything
        else: one line (the handler already answered the client)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        print(f"candle-nn-app: error: {client_address[0]}: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)


def make_server(host: str, port: int, max_connections: int = 64,
                timeout_s: float = 30.0) -> Server:
    """A server bound to ``host:port`` (port 0: a free one), not yet serving: bind first, so a
    taken port is an error before the models load. ``max_connections`` and ``timeout_s``: see
    :class:`Server`."""
    return Server((host, port), type("Handler", (Handler,), {"timeout": timeout_s}),
                  max_connections)


def _refuse(request: socket.socket, max_connections: int) -> None:
    """A 503 for a connection beyond the limit, written without a handler thread (best effort:
    the socket is closed next)."""
    body = json.dumps({"error": f"the server is busy ({max_connections} connections open): "
                                "try again in a moment"}).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    try:
        request.settimeout(1.0)
        request.sendall(head + body)
    except OSError:
        pass


def serve(server: Server, app: App) -> None:
    """Answer requests with ``app`` until interrupted."""
    server.RequestHandlerClass.app = app
    server.serve_forever()


class Handler(BaseHTTPRequestHandler):
    app: App
    server_version = "candle-nn-app"
    sys_version = ""

    def do_GET(self) -> None:
        self._answer(lambda: self._get(urlsplit(self.path).path))

    def do_POST(self) -> None:
        self._answer(lambda: self._post(urlsplit(self.path).path))

    def _get(self, route: str) -> Any:
        if route in ("/", "/index.html"):
            return PAGE.read_bytes()
        if route == "/api/info":
            return self.app.info
        if route == "/api/status":
            return self.app.status()
        raise RequestError(HTTPStatus.NOT_FOUND, f"no such page: {route}")

    def _post(self, route: str) -> Any:
        app = self.app
        if route == "/api/upload":
            data = self._body(app.max_upload_bytes, "the upload")
            return app.upload(self.headers.get("X-Session") or None, data)
        request = self._json()
        if route == "/api/sample":
            return app.add_image(_text(request, "session", required=False), app.sample)
        jobs: dict[str, Callable[..., Any]] = {
            "/api/embed": lambda s, i, r: app.models.embed(s, i),
            "/api/segment": app.models.segment, "/api/everything": app.models.everything,
            "/api/detect": app.models.detect, "/api/classify": app.models.classify}
        if route not in jobs:
            raise RequestError(HTTPStatus.NOT_FOUND, f"no such API: {route}")
        session, image = _text(request, "session"), _text(request, "image")
        app.sessions.image(session, image)  # an unknown image is refused before it queues
        return app.worker.run(jobs[route], session, image, request,
                              abandoned=self._client_gone, poll_s=CLIENT_POLL_S)

    def _client_gone(self) -> bool:
        """Whether the client has closed its connection (it is readable, and reads as the end
        or as a reset); pipelined bytes of a next request do not count."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
        except (OSError, ValueError):
            return True

    def _body(self, limit: int, what: str) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, f"{what} needs a Content-Length")
        if int(length) > limit:
            self._discard(int(length))
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"{what} is {_size(int(length))}, above the {_size(limit)} limit"
                               + ("; start the app with a larger --max-upload-mb"
                                  if what == "the upload" else ""))
        return self.rfile.read(int(length))

    def _discard(self, length: int) -> None:
        """Read and drop a refused body, so the client gets to read the answer (one that sends
        more than :data:`MAX_DISCARD_BYTES` is cut off instead)."""
        self.close_connection = True
        if length > MAX_DISCARD_BYTES:
            return
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 20))
            if not chunk:
                break
            length -= len(chunk)

    def _json(self) -> dict[str, Any]:
        body = self._body(MAX_JSON_BYTES, "the request")
        try:
            request = json.loads(body or b"{}")
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise RequestError(HTTPStatus.BAD_REQUEST, "the request is not JSON") from None
        except RecursionError:  # json's parser recurses once per level of [ or {
            raise RequestError(HTTPStatus.BAD_REQUEST, "the request's JSON is nested too "
                                                       "deeply (send a flat object)") from None
        if not isinstance(request, dict):
            raise RequestError(HTTPStatus.BAD_REQUEST, "the request must be a JSON object")
        return request

    def _answer(self, handle: Callable[[], Any]) -> None:
        try:
            self._check_host()
            body = handle()
            status = HTTPStatus.OK
        except (Abandoned, ConnectionError, TimeoutError):  # the client hung up or went silent
            self.close_connection = True
            return
        except RequestError as exc:
            status, body = exc.status, {"error": str(exc)}
        except BusyError as exc:
            status, body = HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)}
        except CandleNNError as exc:  # bad input: an image, a prompt, a session
            status, body = HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        except Exception as exc:  # a defect: one line here and in the server's log
            status = HTTPStatus.INTERNAL_SERVER_ERROR
            body = {"error": f"internal error ({type(exc).__name__}: {exc}); see the server's "
                             "output"}
            print(f"candle-nn-app: error: {self.command} {self.path}: {type(exc).__name__}: "
                  f"{exc}", file=sys.stderr, flush=True)
        if isinstance(body, bytes):
            self._send(status, body, "text/html; charset=utf-8")
        else:
            self._send(status, json.dumps(body).encode(), "application/json")

    def _check_host(self) -> None:
        """On a loopback address, only loopback Host names: a web page elsewhere cannot reach
        the app through DNS rebinding."""
        bound = self.server.server_address[0]
        if not ipaddress.ip_address(bound).is_loopback:
            return
        host = urlsplit(f"//{self.headers.get('Host', '')}").hostname or ""
        if host not in ("localhost", "127.0.0.1", "::1") and host != bound:
            raise RequestError(HTTPStatus.FORBIDDEN, f"Host {host!r} is not this computer")

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        try:
            self.end_headers()
            self.wfile.write(body)
        except (ConnectionError, TimeoutError):  # the client hung up: nobody to tell
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are not logged (errors are: see :meth:`_answer`)."""


def _text(request: dict[str, Any], key: str, required: bool = True) -> str | None:
    value = request.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > 64:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"the request needs a {key!r}")
    return value


def _size(count: int) -> str:
    return f"{count / 2**20:.1f} MiB" if count >= 2**20 else f"{count} bytes"
