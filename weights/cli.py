"""``candle-nn-weights``: list, download, convert and inspect checkpoints.

    candle-nn-weights list
    candle-nn-weights download yolo_v8 s
    candle-nn-weights convert --from ultralytics best.pt best.safetensors
    candle-nn-weights inspect best.safetensors

Errors are one ``error: …`` line on stderr and exit status 1 (candle_nn.cli.run_main).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from candle_nn import CandleNNError
from candle_nn.cli import run_main

from .convert import SOURCES, check_output, convert, read_names, save
from .inspection import format_report, inspect_file
from .registry import CHECKPOINTS, download
from .spec import SPECS

CONVERT_HELP = """\
Convert a PyTorch checkpoint to safetensors under candle's tensor names, with metadata
(model, variant, task, class names) that the model CLIs use by default. It takes the weights the
source tool would load: --from timm the EMA copy when the file has one (timm's default),
--from torchvision the model's own, ultralytics' ema before model; and says which.

READING A PICKLE: .pt/.pth checkpoints are Python pickles, and unpickling can run code named by
the file. This command reads them only because you ask it to, and never through torch: the file
must be a plain torch.save checkpoint (TorchScript archives and other formats are refused before
anything is read), and its pickle may hold only tensors and containers (ultralytics files also
ultralytics/torch.nn classes, kept as inert stand-ins); anything else is refused.
Convert only files you trust. (.safetensors sources need no unpickling.)
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="candle-nn-weights",
        description="Known checkpoints: download candle's published files, convert PyTorch "
                    "checkpoints, inspect safetensors files.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("list", help="the published checkpoints this tool can download")

    p = sub.add_parser("download", help="fetch a published checkpoint into the Hugging Face cache")
    p.add_argument("model", help=", ".join(sorted({m for m, _ in CHECKPOINTS})))
    p.add_argument("variant", help="e.g. resnet50, n, tiny (see `list`)")
    p.add_argument("--force", action="store_true", help="download again even when cached")

    p = sub.add_parser("convert", help="PyTorch checkpoint -> candle safetensors (reads a pickle)",
                       description=CONVERT_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="kind", required=True, choices=SOURCES,
                   help="torchvision/timm: a ResNet state_dict; ultralytics: a YOLOv8 detect/pose "
                        ".pt; mobile_sam: MobileSAM's mobile_sam.pt")
    p.add_argument("src", help="the checkpoint (.pt, .pth, .bin, or .safetensors for state_dicts)")
    p.add_argument("out", help="the .safetensors file to write")
    p.add_argument("--variant", default=None,
                   help="expected variant (checked; default: read from the checkpoint)")
    p.add_argument("--num-classes", type=int, default=None,
                   help="expected class count (checked; default: read from the head)")
    p.add_argument("--names", default=None,
                   help="class names: a text file (one per line) or JSON list; default: the "
                        "checkpoint's own (ultralytics)")

    p = sub.add_parser("inspect", help="names, shapes, dtypes, size; which model/variant fits",
                       description="Exit status 0 when the file fits a model (the --model one, "
                                   "if given), 1 otherwise.")
    p.add_argument("file", help="a .safetensors file")
    p.add_argument("--model", choices=list(SPECS), default=None,
                   help="compare with this model only")
    p.add_argument("--variant", default=None, help="with --model: this variant only")
    p.add_argument("--summary", action="store_true", help="do not list every tensor")
    return parser


def _list() -> int:
    print(f"{'model':<14}{'variant':<10}{'tensors':>8}  hub file")
    for entry in CHECKPOINTS.values():
        tensors = "?" if entry.tensors is None else str(entry.tensors)
        print(f"{entry.model:<14}{entry.variant:<10}{tensors:>8}  {entry.repo_id}/{entry.filename}")
    print("\nDownload one with `candle-nn-weights download MODEL VARIANT` (into the Hugging Face "
          "cache), or pass any file to a model CLI with --weights PATH.")
    return 0


def _convert(args: argparse.Namespace) -> int:
    if Path(args.src).resolve() == Path(args.out).resolve():
        raise CandleNNError(f"OUT is the source checkpoint {args.src}; pass another output path")
    check_output(args.out)  # before the (possibly long) conversion
    names = read_names(args.names) if args.names else None
    converted = convert(args.kind, args.src, variant=args.variant, num_classes=args.num_classes,
                        names=names)
    out = save(converted, args.out)
    meta = converted.metadata
    counts = [f"{meta.num_classes} classes"] if meta.num_classes is not None else []
    counts += [f"{meta.num_keypoints} keypoints"] if meta.num_keypoints is not None else []
    print(f"wrote {out}: {meta.model} {meta.variant}"
          + (f" ({', '.join(counts)})" if counts else "")
          + f", {len(converted.tensors)} tensors"
          + (f", class names kept ({len(meta.names)})" if meta.names else ""))
    if converted.dropped:
        print(f"dropped {len(converted.dropped)} tensors not used by candle "
              "(BatchNorm num_batches_tracked, index buffers, tensors outside the model)")
    for note in converted.notes:
        print(f"note: {note}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    if args.variant is not None and args.model is None:
        raise CandleNNError("inspect: --variant needs --model")
    report = inspect_file(args.file, args.model, args.variant)
    print(format_report(report, show_tensors=not args.summary))
    return 0 if report.fitting else 1


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "list":
        return _list()
    if args.command == "download":
        print(download(args.model, args.variant, force=args.force))
        return 0
    if args.command == "convert":
        return _convert(args)
    return _inspect(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``candle-nn-weights``; returns the exit status."""
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
