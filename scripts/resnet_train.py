"""``candle-resnet train``: fine-tune a ResNet on your own images (ImageFolder layout).

    candle-resnet train --data DIR [--out runs/train] [--variant resnet18] [--weights FILE]
                        [--epochs 10] [--batch-size 32] [--lr LR] [--optimizer sgd|adamw]
                        [--freeze-backbone] [--freeze-bn] [--imgsz 224] [--val-fraction 0.2]
    candle-resnet train --resume --out runs/train
    mlx.launch -n 2 --backend ring -- candle-resnet train ...   (data parallel; docs/training.md)

The backbone comes from ``--weights`` (default: candle's published ImageNet ``--variant``) and a
new, seeded ``fc`` head for the data folder's class count; ``--no-pretrained`` starts from seeded
Kaiming weights (offline: ``--weights`` a file you hold, e.g. converted from a torchvision
``.pth`` by ``candle-nn-weights convert --from torchvision``). The run folder gets
``best.safetensors`` and ``labels.txt``, which ``candle-resnet --image x.jpg --weights
OUT/best.safetensors --labels OUT/labels.txt`` uses; a new run refuses a folder holding a run,
and the run holds ``OUT/train.lock`` while it trains. Progress goes to stderr; stdout gets one JSON
line at the end: ``run``, ``epochs_done``, ``best``, ``labels``, ``best_accuracy``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from candle_nn import CandleNNError, Device, VarBuilder, VarMap, freeze_bn_stats
import mlx.core as mx

from candle_nn_models.classify_trainer import (BEST, CHECKPOINT, LABELS, OPTIMIZERS, RESULTS,
                                               ClassifierTrainer, TrainConfig, read_checkpoint)
from candle_nn_models.data_parallel import capped_batch, check_batch_norm_batch
from candle_nn_models.image_folder import ImageFolder
from candle_nn_models.resnet import VARIANTS, ResNet
from candle_nn_models.scripts.common import (number_arg, parse_device, positive, resumable_parser,
                                             shown)
from candle_nn_models.scripts.resnet_weights import open_resnet_weights
from candle_nn_models.scripts.train_run_folder import (check_run_unheld, hold_run,
                                                       refuse_existing_run)
from candle_nn_models.training_size import IMGSZ_KEY, MAX_IMGSZ, MIN_IMGSZ
from candle_nn_models.weights.metadata import WeightsMetadata

DEFAULT_LR = {"sgd": 0.01, "adamw": 1e-3}
# what a resumed run may change: where it runs, not what it computes
RESUME_MAY_SET = {"resume", "out", "data", "device", "workers", "verbose", "no_progress"}
TOOL = "candle-resnet train"
RUN_FILES = (CHECKPOINT, BEST, LABELS, RESULTS)  # any of them: the folder holds a run


def _fraction(text: str) -> float:
    value = number_arg(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1 (exclusive)")
    return value


def build_parser(suppress: bool = False) -> argparse.ArgumentParser:
    """The ``train`` options (``suppress``: no defaults, to see which options were given)."""
    parser, d = resumable_parser(
        "candle-resnet train",
        "Fine-tune a ResNet classifier on a folder of images, one subfolder per "
        "class (or train/ and val/ folders of those).", suppress)
    parser.add_argument("--data", metavar="DIR", help="the image folder (required unless --resume)")
    parser.add_argument("--out", metavar="DIR", **d("runs/train"),
                        help="the run folder: best.safetensors, labels.txt, checkpoint, "
                             "results.csv (default runs/train)")
    parser.add_argument("--resume", action="store_true", **d(False),
                        help="continue the run in --out from its last finished epoch")
    parser.add_argument("--variant", choices=tuple(VARIANTS), help="ResNet depth (default: what "
                        "--weights holds, else resnet18)")
    parser.add_argument("--weights", metavar="FILE", help="pretrained ResNet safetensors for the "
                        "backbone (default: candle's published ImageNet weights of --variant)")
    parser.add_argument("--no-pretrained", action="store_true", **d(False),
                        help="start from seeded random (Kaiming) weights instead")
    parser.add_argument("--epochs", type=positive(int), metavar="N", **d(10), help="default 10")
    parser.add_argument("--batch-size", type=positive(int), metavar="N", **d(32),
                        help="images per step, over all processes (default 32)")
    parser.add_argument("--lr", type=positive(float), metavar="LR",
                        help="initial learning rate, cosine-decayed to 0 (default 0.01 for SGD, "
                             "0.001 for AdamW)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, **d("sgd"),
                        help="sgd (momentum 0.9) or adamw (default sgd)")
    parser.add_argument("--weight-decay", type=lambda t: number_arg(t), metavar="WD",
                        help="default 1e-4 for SGD, 0.01 for AdamW")
    parser.add_argument("--freeze-backbone", action="store_true", **d(False),
                        help="train the new head only (backbone weights and BatchNorm frozen)")
    parser.add_argument("--freeze-bn", action="store_true", **d(False),
                        help="keep BatchNorm running statistics fixed (their scale/shift learn)")
    parser.add_argument("--imgsz", type=positive(int), metavar="PIXELS", **d(224),
                        help=f"training crop size, {MIN_IMGSZ} to {MAX_IMGSZ}; evaluation "
                             "resizes to imgsz*256/224 and crops imgsz (default 224)")
    parser.add_argument("--val-fraction", type=_fraction, metavar="F", **d(0.2),
                        help="share of each class held out for validation when the folder has no "
                             "train/ + val/ split (default 0.2)")
    parser.add_argument("--seed", type=lambda t: number_arg(t, int), metavar="N", **d(0),
                        help="seeds the head, the split, the order and the augmentation "
                             "(default 0)")
    parser.add_argument("--workers", type=positive(int), metavar="N",
                        **d(min(8, os.cpu_count() or 1)),
                        help="image decoding threads (default: CPU count, at most 8)")
    parser.add_argument("--no-progress", action="store_true", **d(False),
                        help="no progress bar (the per-epoch lines stay)")
    parser.add_argument("--device", help="cpu, gpu or gpu:N (default: the GPU when MLX has one, "
                                          "else the CPU)")
    parser.add_argument("--verbose", action="store_true", **d(False),
                        help="print the MLX version, devices, CPU BLAS and float32 precision "
                             "in use (to stderr)")
    return parser


def _explicit(argv: Sequence[str]) -> set[str]:
    return set(vars(build_parser(suppress=True).parse_args(argv)))


def build_model(variant: str | None, weights: str | None, pretrained: bool, num_classes: int,
                seed: int, device: Device) -> tuple[ResNet, str]:
    """A trainable ResNet (BatchNorm unfolded): the backbone of ``weights`` (or the published
    ``variant``; or seeded Kaiming weights when not ``pretrained``) and a new seeded head."""
    varmap = VarMap()
    if pretrained:
        source, variant, _, _ = open_resnet_weights(weights, variant, device)
        for name in source.names():
            if not name.startswith("fc."):
                varmap.set(name, source.get(None, name))
    variant = variant or "resnet18"
    vb = VarBuilder.from_varmap(varmap, seed=seed, device=device)
    return ResNet.load(vb, variant, num_classes=num_classes, fold_bn=False), variant


def _run_args(args: argparse.Namespace, checkpoint: dict | None,
              out: Path) -> argparse.Namespace:
    """The run's options: as given, or (``--resume``) as the checkpoint saved them."""
    if checkpoint is None:
        return args
    saved = dict(checkpoint["run"]) if isinstance(checkpoint["run"], dict) else {}
    # every option but where it runs (and the data folder, which --data may give)
    needed = set(vars(args)) - RESUME_MAY_SET - {"data"}
    if not needed <= set(saved):
        raise CandleNNError(f"{out / CHECKPOINT} was not written by candle-resnet train: it does "
                            "not record the run's options to resume with (resume it with the "
                            "Python API that wrote it, or start the run again without --resume)")
    for key in RESUME_MAY_SET:
        if key in vars(args) and (key != "data" or args.data is not None):
            saved[key] = getattr(args, key)
    return argparse.Namespace(**saved)


def main(argv: Sequence[str]) -> int:
    """``candle-resnet train ARGS`` (errors are raised; the caller prints them)."""
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    checkpoint = None
    if args.resume:
        conflicting = sorted(_explicit(argv) - RESUME_MAY_SET)
        if conflicting:
            flags = ", ".join("--" + k.replace("_", "-") for k in conflicting)
            raise CandleNNError(f"--resume continues the run in {out} with its own settings; "
                                f"drop {flags} (or start a new run with another --out)")
        _, checkpoint = read_checkpoint(out / CHECKPOINT)
        if checkpoint["epoch"] >= checkpoint["config"]["epochs"]:
            raise CandleNNError(f"the run in {out} already finished its "
                                f"{checkpoint['config']['epochs']} epochs; nothing to resume")
    elif args.data is None:
        raise CandleNNError("pass --data DIR (a folder of class subfolders), or --resume")
    else:
        refuse_existing_run(out, RUN_FILES)
    run = _run_args(args, checkpoint, out)
    if run.data is None:
        raise CandleNNError(f"the checkpoint in {out} does not say which data folder it used; "
                            "pass --data DIR")
    group = mx.distributed.init()
    main_rank = group.rank() == 0
    if run.imgsz < MIN_IMGSZ:
        raise CandleNNError(f"--imgsz {run.imgsz} is below {MIN_IMGSZ}: a ResNet downsamples "
                            f"32x, so smaller images leave no spatial detail; pass --imgsz "
                            f"{MIN_IMGSZ} or more")
    if run.imgsz > MAX_IMGSZ:
        raise CandleNNError(f"--imgsz {run.imgsz} is above {MAX_IMGSZ}: memory grows with its "
                            f"square (a ResNet at 3000 px needs 2.5 GB an image); pass --imgsz "
                            f"{MAX_IMGSZ} or less")
    device = parse_device(run.device, run.verbose and main_rank)
    data = ImageFolder.read(run.data, run.val_fraction, run.seed, run.workers)
    if main_rank:
        for path, reason in data.skipped:
            print(f"warning: {shown(path)}: {reason}; image skipped", file=sys.stderr)
    batch = capped_batch(run.batch_size, len(data.train), group.size())
    if not (run.freeze_bn or run.freeze_backbone):
        check_batch_norm_batch(batch, group.size(), run.imgsz, "--batch-size")
    # a resumed run takes every weight from its checkpoint: no backbone file (or download)
    model, variant = build_model(run.variant, None if checkpoint else run.weights,
                                 not (run.no_pretrained or checkpoint), len(data.classes),
                                 run.seed, device)
    if batch != run.batch_size and main_rank:  # once the weights are known good
        print(f"warning: --batch-size {run.batch_size} is more than the {len(data.train)} "
              f"training images; each batch takes all {batch}", file=sys.stderr)
    frozen = None
    if run.freeze_backbone:
        model.freeze()
        model.fc.unfreeze()
        freeze_bn_stats(model)
        frozen = (lambda x: model.forward_features(x)["pooled"], model.fc)
    elif run.freeze_bn:
        freeze_bn_stats(model)

    optimizer = run.optimizer
    config = TrainConfig(epochs=run.epochs, batch_size=batch,
                         lr=run.lr if run.lr is not None else DEFAULT_LR[optimizer],
                         optimizer=optimizer, weight_decay=run.weight_decay, imgsz=run.imgsz,
                         seed=run.seed)
    best_meta = WeightsMetadata(model="resnet", variant=variant, task="classify",
                                num_classes=len(data.classes), names=data.classes,
                                source="candle-resnet train",
                                extra={IMGSZ_KEY: str(run.imgsz)}).to_dict()
    if main_rank:
        check_run_unheld(out, TOOL)
    run_info = {k: v for k, v in vars(run).items() if k not in RESUME_MAY_SET - {"data"}}
    run_info["data"] = os.fspath(Path(run.data).absolute())
    run_info["variant"] = variant  # what --weights held, for --resume
    trainer = ClassifierTrainer(model, config, data, out, best_metadata=best_meta, group=group,
                                workers=run.workers, progress=not run.no_progress,
                                run_info=run_info, frozen=frozen,
                                log=lambda line: print(line, file=sys.stderr, flush=True))
    try:
        with hold_run(out, TOOL, main_rank, () if checkpoint else RUN_FILES), model.on_device():
            if checkpoint is not None:
                trainer.resume()
            if main_rank:
                print(f"{variant}: {len(data.train)} training / {len(data.val)} validation "
                      f"images, {len(data.classes)} classes, {trainer.steps_per_epoch} steps per "
                      "epoch" + (f", {group.size()} processes" if group.size() > 1 else "")
                      + (f"; resuming after epoch {trainer.epoch}" if checkpoint else ""),
                      file=sys.stderr)
            trainer.fit()
    except (RuntimeError, ValueError, MemoryError) as exc:  # MLX's: out of memory, a bad shape
        raise CandleNNError(f"training stopped in epoch {trainer.epoch + 1}: "
                            f"{type(exc).__name__}: {exc}; {shown(out)} keeps the last finished "
                            "epoch (--resume)") from exc
    if main_rank:
        print(f"best validation accuracy {100 * trainer.best_accuracy:.1f}%: "
              f"{shown(out / BEST)}, labels {shown(out / LABELS)}", file=sys.stderr)
        print(json.dumps({"run": str(out), "epochs_done": trainer.epoch, "best": str(out / BEST),
                          "labels": str(out / LABELS),
                          "best_accuracy": trainer.best_accuracy}))
    return 0
