"""``candle-nn-app``: segment, detect and classify in the browser — a local web app over one
uploaded (or the sample) image.

    candle-nn-app [--host 127.0.0.1] [--port 8765] [--device cpu]
                  [--sam-weights FILE] [--sam-model tiny|vit_b|...] [--detect-weights FILE]
                  [--pose-weights FILE] [--classify-weights FILE] [--sample FILE]
                  [--max-pixels N] [--max-upload-mb N] [--max-sessions N] [--max-images N]
                  [--max-embeddings N] [--max-queue N] [--max-connections N] [--timeout S]

Loads MobileSAM, YOLOv8 detect and pose and a ResNet as the CLIs do (defaults: candle's published
checkpoints from the Hugging Face hub; a bad file is one error line before anything is served),
then serves ``http://HOST:PORT/`` until Ctrl-C. The page, the API and the limits:
``scripts/app_server.py`` and ``docs/app.md``.
"""

from __future__ import annotations

import argparse
from typing import Sequence

from candle_nn import CandleNNError
from candle_nn.cli import ArgumentParser
from candle_nn_models.scripts.common import (DEFAULT_MAX_PIXELS, add_device_argument, load_rgb,
                                             number_arg, pixel_count, positive, run_main)
from candle_nn_models.scripts.segment_anything import MODELS

DEFAULT_PORT = 8765
APP_MAX_PIXELS = 40_000_000  # every held image is kept decoded: 120 MB of RGB at this size


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="candle-nn-app",
        description="A local web app: click to segment with MobileSAM, detect with YOLOv8, "
                    "classify with ResNet, on an uploaded image or the sample.",
        epilog="Open the printed address in a browser. Binds to 127.0.0.1 (this computer only) "
               "unless --host says otherwise.")
    net = parser.add_argument_group("server")
    net.add_argument("--host", default="127.0.0.1",
                     help="address to listen on (default 127.0.0.1: this computer only; "
                          "0.0.0.0 lets other computers in)")
    net.add_argument("--port", type=_port, default=DEFAULT_PORT,
                     help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    net.add_argument("--sample", default=None, metavar="FILE",
                     help="the image the Sample button shows (default: a drawn scene)")
    models = parser.add_argument_group("models (default: candle's published checkpoints)")
    models.add_argument("--sam-model", default=None, choices=MODELS,
                        help="SAM encoder (default: what --sam-weights holds, else MobileSAM)")
    models.add_argument("--sam-weights", default=None, metavar="FILE",
                        help="SAM safetensors (as candle-segment-anything --weights)")
    models.add_argument("--detect-weights", default=None, metavar="FILE",
                        help="YOLOv8 detection safetensors (as candle-yolo-v8 --weights; "
                             "default yolov8n)")
    models.add_argument("--pose-weights", default=None, metavar="FILE",
                        help="YOLOv8 pose safetensors (default yolov8n-pose)")
    models.add_argument("--classify-weights", default=None, metavar="FILE",
                        help="ResNet safetensors (as candle-resnet --weights; default resnet18)")
    add_device_argument(parser)
    limits = parser.add_argument_group("limits (memory and work per visitor)")
    limits.add_argument("--max-pixels", type=pixel_count, default=APP_MAX_PIXELS, metavar="N",
                        help=f"refuse images with more pixels (default {APP_MAX_PIXELS}; the "
                             f"CLIs' is {DEFAULT_MAX_PIXELS}, but the app keeps images decoded)")
    limits.add_argument("--max-upload-mb", type=positive(float), default=32.0, metavar="N",
                        help="refuse uploads larger than N MiB (default 32)")
    limits.add_argument("--max-sessions", type=positive(int), default=16, metavar="N",
                        help="visitors whose images are kept; the least recently active is "
                             "forgotten (default 16)")
    limits.add_argument("--max-images", type=positive(int), default=4, metavar="N",
                        help="images kept per visitor (default 4)")
    limits.add_argument("--max-embeddings", type=positive(int), default=2, metavar="N",
                        help="SAM image embeddings (4 MiB each) cached per visitor; an evicted "
                             "one is computed again (default 2)")
    limits.add_argument("--max-queue", type=positive(int), default=64, metavar="N",
                        help="model requests waiting at once; more are answered 'busy' "
                             "(default 64)")
    limits.add_argument("--max-connections", type=positive(int), default=64, metavar="N",
                        help="connections served at once, one thread each; more are answered "
                             "'busy' (default 64)")
    limits.add_argument("--timeout", type=positive(float), default=30.0, metavar="S",
                        help="close a connection that sends nothing for S seconds (a stalled "
                             "upload, an idle browser connection; default 30)")
    return parser


def _port(text: str) -> int:
    value = number_arg(text, int)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port (0..65535)")
    return value


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    from candle_nn_models.scripts.app_models import AppModels
    from candle_nn_models.scripts.app_sample import sample_image
    from candle_nn_models.scripts.app_server import App, make_server, serve
    from candle_nn_models.scripts.app_sessions import Sessions
    from candle_nn_models.scripts.app_worker import ModelWorker

    sample = load_rgb(args.sample, args.max_pixels) if args.sample else sample_image()
    try:
        server = make_server(args.host, args.port, args.max_connections, args.timeout)
    except OSError as exc:
        raise CandleNNError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; "
                            "pass another --port (0: any free one)") from None
    sessions = Sessions(args.max_sessions, args.max_images, args.max_embeddings)
    worker = ModelWorker(args.max_queue)
    try:
        # on the thread that will run them
        models = worker.run(AppModels, args, sessions, worker.stop_requested)
        app = App(models, worker, sessions, sample, args.max_pixels,
                  int(args.max_upload_mb * 2**20))
        host, port = server.server_address[:2]
        shown_host = f"[{host}]" if ":" in host else host
        print(f"candle-nn-app: serving on http://{shown_host}:{port}/ (Ctrl-C to stop)",
              flush=True)
        serve(server, app)
    finally:
        server.server_close()
        worker.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``candle-nn-app``."""
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
