"""``candle-nn-batch``: run a model over a large image collection on Ray Data, into Parquet.

    candle-nn-batch {resnet,yolo_v8,yolo_v8_pose,segment_anything}
                    --input DIR|GLOB|LIST.txt|PARQUET --output DIR [--weights FILE]
                    [--device cpu|gpu] [--batch-size N] [--actors N] [--address ray://…|auto]
                    [--verbose]

Images are decoded and preprocessed in Ray tasks, the model runs in a pool of actors that load
the weights once (one GPU each on a GPU job), and every image becomes one row of a Parquet shard
in ``--output``: its path, size, the model's output, or an ``error``. Rerunning with the same
``--output`` resumes: images with a result are skipped, failed ones are retried. One job at a
time per ``--output``, and only with the weights (by SHA-256) and options that made its rows
(``ray_output``). Without ``--address`` a local Ray runtime is started on this machine; Ray's
own log lines show with ``--verbose``. Needs the ``batch`` extra (Ray Data, pycocotools).
See docs/batch.md.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Iterator, Sequence

from candle_nn import CandleNNError, Device, DeviceUnavailableError
from candle_nn.blas import warn_if_slow_cpu
from candle_nn_models.scripts.common import (environment_restored, fraction, prepare_out_dir,
                                             run_main, yolo_input_size)
from candle_nn_models.weights.spec import SPECS

MODELS = ("resnet", "yolo_v8", "yolo_v8_pose", "segment_anything")
EXTRA_HINT = "pip install 'candle-nn-mlx[batch]'"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="candle-nn-batch",
        description="Run a model over many images on Ray Data and write Parquet shards "
                    "(one row per image; reruns resume and retry failed images). See "
                    "docs/batch.md.")
    parser.add_argument("model", choices=MODELS)
    parser.add_argument("--input", required=True, metavar="DIR|GLOB|LIST.txt|PARQUET",
                        help="a folder of images, a glob ('photos/**/*.jpg'), a text file with "
                             "one path a line, or a Parquet file with a 'path' column")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="folder for the Parquet shards; reuse it to resume a job (same "
                             "weights and options). Files in it that the job did not write are "
                             "never changed; other Parquet files there are refused")
    parser.add_argument("--weights", default=None, metavar="FILE",
                        help="safetensors in candle's layout, reachable at this path on every "
                             "node (default: candle's published checkpoint from the Hugging Face "
                             "hub, fetched by each node)")
    variants = " / ".join(", ".join(SPECS[family].variants)
                          for family in ("resnet", "yolo_v8", "mobile_sam", "sam"))
    parser.add_argument("--variant", default=None,
                        help=f"{variants} (default: what --weights holds; SAM: "
                             f"{SPECS['mobile_sam'].variants[0]})")
    parser.add_argument("--device", choices=("cpu", "gpu"), default=None,
                        help="where the actors run the model (default: gpu when there are GPUs)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="images per model call (default 8 on the CPU, 32 on GPUs)")
    parser.add_argument("--actors", type=int, default=None,
                        help="model replicas (default: one per GPU; on the CPU one per core "
                             "but one, each on one core)")
    parser.add_argument("--shard-rows", type=int, default=1000,
                        help="rows per Parquet shard, about (default 1000)")
    parser.add_argument("--address", default=None, metavar="ray://HOST:PORT|auto",
                        help="join this Ray cluster (default: start a local Ray runtime)")
    parser.add_argument("--top-k", type=int, default=5, help="resnet: classes kept (default 5)")
    parser.add_argument("--conf", type=fraction, default=0.25,
                        help="yolo: minimum class score (default 0.25)")
    parser.add_argument("--iou", type=fraction, default=0.7,
                        help="yolo: NMS IoU threshold (default 0.7, as ultralytics' predict)")
    parser.add_argument("--size", type=yolo_input_size, default=None,
                        help="yolo: inputs are letterboxed to size x size; resnet: the centre "
                             "crop (default: the size the weights were trained at, else 640 "
                             "for yolo, 224 for resnet)")
    parser.add_argument("--verbose", action="store_true",
                        help="show Ray's own log lines and Ray Data's progress (default: only "
                             "this program's messages, and a progress bar on a terminal)")
    return parser


def require_batch_extra() -> None:
    """CandleNNError naming the extra to install when Ray Data (or pycocotools) is missing."""
    try:
        import pyarrow  # noqa: F401
        import pycocotools  # noqa: F401
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise CandleNNError(f"candle-nn-batch needs Ray Data, which is not installed "
                            f"({exc.msg}): {EXTRA_HINT}") from None


def start_ray(address: str | None, local_cpus: int, local_gpus: int,
              verbose: bool = False) -> bool:
    """Connect to ``address`` or start a local runtime with ``local_cpus`` CPUs and the GPUs
    MLX has (Ray would miss a Mac's, or count CUDA GPUs a CPU-only MLX cannot use); returns
    whether this call started (and so should stop) Ray. A connected process is left as is.

    Without ``verbose`` Ray's Python loggers print errors only and workers' output is not
    forwarded (Ray's log files in its session folder keep everything)."""
    import ray

    if ray.is_initialized():
        return False
    if verbose:
        quiet = {"logging_level": logging.INFO, "log_to_driver": True}
    else:
        quiet = {"logging_level": logging.ERROR, "log_to_driver": False}
    if address is None:
        ray.init(num_cpus=local_cpus, num_gpus=local_gpus, include_dashboard=False, **quiet)
        return True
    try:
        ray.init(address=address, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise CandleNNError(f"cannot join the Ray cluster at {address}: {exc}") from None
    return True


@contextlib.contextmanager
def native_stderr_to_devnull() -> Iterator[None]:
    """Point file descriptor 2 at the null device while Python's ``sys.stderr`` keeps writing
    where it did. Ray's C++ core writes its log lines (``[… E …] core_worker.cc: …``, about
    Ray's internals) to its log file *and* to descriptor 2, whatever the log level; setting
    ``RAY_BACKEND_LOG_LEVEL`` prints a line of its own. This program's messages, errors and
    Ray Data's progress bar go through ``sys.stderr``, so they still show."""
    sys.stderr.flush()
    saved = os.dup(2)
    stream = open(saved, "w", encoding=sys.stderr.encoding, errors="backslashreplace",
                  buffering=1, closefd=False)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    previous, sys.stderr = sys.stderr, stream
    try:
        yield
    finally:
        stream.flush()
        os.dup2(saved, 2)
        os.close(saved)
        sys.stderr = previous


def plan(args: argparse.Namespace, cpus: int, gpus: int):
    """The job's :class:`~candle_nn_models.scripts.ray_pipeline.Resources` on a cluster of
    ``cpus``/``gpus`` (default device: the GPU when there is one)."""
    from candle_nn_models.scripts.ray_pipeline import Resources

    device = args.device or ("gpu" if gpus else "cpu")
    if device == "gpu":
        actors = args.actors or gpus
        if actors > gpus:
            raise DeviceUnavailableError(
                f"--device gpu with {actors} actor(s) needs {actors} GPU(s), the Ray cluster has "
                f"{gpus}: pass --actors {gpus} or --device cpu" if gpus else
                "--device gpu, but the Ray cluster has no GPU: pass --device cpu")
    else:
        actors = args.actors or max(1, cpus - 1)
    return Resources(device=device, actors=actors,
                     batch_size=args.batch_size or (32 if device == "gpu" else 8),
                     shard_rows=args.shard_rows)


def local_cpus(actors: int | None, device: str) -> int:
    """Ray's CPU count on this machine: its cores, or more so that one core stays for decoding
    when CPU actors take one each."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(cores or 1, (actors or 0) + 1 if device == "cpu" else 1)


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    for flag in ("batch_size", "actors", "shard_rows", "top_k"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise CandleNNError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    require_batch_extra()
    import ray

    from candle_nn_models.scripts.ray_models import JobOptions, batch_model, identify
    from candle_nn_models.scripts.ray_output import preflight
    from candle_nn_models.scripts.ray_pipeline import InputSource, run_job

    source = InputSource.parse(args.input)
    weights = None if args.weights is None else str(Path(args.weights).resolve())
    options = JobOptions(model=args.model, weights=weights, variant=args.variant,
                         top_k=args.top_k, conf=args.conf, iou=args.iou, size=args.size)
    options = identify(options)[0]  # bad weights: one error line here, not in the actors
    preflight(Path(args.output), batch_model(options).identity(), options.weights_label)
    if args.address is None and args.device == "gpu":
        Device.parse("gpu")  # this machine's MLX must have a GPU backend
    local_device = args.device or ("gpu" if Device.default().kind == "gpu" else "cpu")
    if args.address is None:  # actors on this machine: say so if its CPU BLAS is the slow one
        warn_if_slow_cpu(local_device)
    quiet = contextlib.nullcontext() if args.verbose or ray.is_initialized() \
        else native_stderr_to_devnull()
    with quiet, environment_restored():
        started = start_ray(args.address, local_cpus(args.actors, local_device),
                            len(Device.available()) - 1, args.verbose)
        created = not Path(args.output).exists()
        try:
            cluster = ray.cluster_resources()
            resources = plan(args, int(cluster.get("CPU", 1)), int(cluster.get("GPU", 0)))
            output = prepare_out_dir(args.output)  # last: a failed start leaves no folder behind
            if args.address is not None and args.address.startswith("ray://"):
                # Ray Data cannot stream from a Ray Client driver: run the job as a task there.
                summary = ray.get(ray.remote(num_cpus=0)(run_job).remote(
                    source, output, options, resources, verbose=args.verbose))
            else:
                summary = run_job(source, output, options, resources, verbose=args.verbose)
        except BaseException:
            if created:  # a job that failed before writing anything leaves no folder behind
                with contextlib.suppress(OSError):
                    Path(args.output).rmdir()
            raise
        finally:
            if started:
                ray.shutdown()
    print(summary.line(output))
    if summary.rows and summary.errors == summary.rows:  # as the image CLIs: 1 when none did
        raise CandleNNError(f"no image could be processed: all {summary.rows} rows in {output} "
                            "are errors (their 'error' column says why; a rerun retries them)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``candle-nn-batch``."""
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
