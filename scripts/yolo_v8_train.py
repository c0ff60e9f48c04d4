"""``candle-yolo-v8 train``: fine-tune a YOLOv8 detector on your own labelled images.

    candle-yolo-v8 train --data data.yaml [--weights FILE | --variant n] [--epochs 100]
                         [--imgsz 640] [--batch 16] [--optimizer auto|SGD|AdamW] [--lr0 0.01]
                         [--project runs/detect --name train | --out DIR] [--workers 4]
                         [--seed 0] [--close-mosaic 10] [--device cpu]
    candle-yolo-v8 train --resume [--out DIR | --project P --name N]

ultralytics' recipe (``models/yolo_v8_trainer.py``) and augmentations
(``models/yolo_v8_augment.py``) on a ``data.yaml`` (``models/yolo_v8_data.py``). The detector
starts from ``--weights`` (default: candle's published ``yolov8{variant}``) with its class branch
re-initialised when the data has another class count. Writes ``<run>/weights/best.safetensors``
and ``last.safetensors`` (``candle-yolo-v8 --weights`` / ``candle-yolo-v8 val --weights`` read
them, class names included), ``results.csv`` and ``results.png``; a new run in an existing
folder goes to ``train2``, ``train3``, ... (as ultralytics); ``--out`` naming a folder that holds
a run is refused, and the run holds ``<run>/train.lock`` while it trains. ``--resume`` continues
the run from its last finished epoch with its saved settings. Progress goes to stderr; stdout
gets one JSON line at the end: ``run``, ``epochs_done``, ``best``, ``best_fitness``. Offline,
``--weights`` a file you hold (``candle-nn-weights convert --from ultralytics yolov8n.pt ...``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from candle_nn import CandleNNError, VarBuilder, WeightsFileError
import mlx.core as mx

from candle_nn_models.data_parallel import capped_batch, check_batch_norm_batch
from candle_nn_models.yolo11 import STEM as YOLO11_STEM
from candle_nn_models.yolo_v8 import MULTIPLES, YoloV8, infer_spec
from candle_nn_models.yolo_v8_data import DataConfig, DataError
from candle_nn_models.yolo_v8_dataset import DetectionDataset
from candle_nn_models.yolo_v8_trainer import (BEST, CHECKPOINT, LAST, DetectionTrainer,
                                              TrainConfig, new_class_head, read_checkpoint)
from candle_nn_models.scripts.common import (add_device_argument, compile_choice, non_negative,
                                             parse_device, positive, resumable_parser, run_main,
                                             shown, yolo_input_size)
from candle_nn_models.scripts.train_run_folder import (check_run_unheld, hold_run,
                                                       refuse_existing_run)
from candle_nn_models.weights.metadata import WeightsMetadata
from candle_nn_models.weights.registry import resolve_weights

# what a resumed run may change: where it runs, not what it computes
RESUME_MAY_SET = {"resume", "out", "project", "name", "device", "workers", "verbose", "compile",
                  "stop_after", "no_progress"}
TOOL = "candle-yolo-v8 train"
# any of them: the folder holds a run
RUN_FILES = tuple(f"weights/{name}" for name in (CHECKPOINT, BEST, LAST)) + ("results.csv",)


def _optimizer(text: str) -> str:
    names = {"auto": "auto", "sgd": "SGD", "adamw": "AdamW"}
    if text.lower() not in names:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of auto, SGD, AdamW")
    return names[text.lower()]


def build_parser(suppress: bool = False) -> argparse.ArgumentParser:
    """The ``train`` options (``suppress``: no defaults, to see which options were given)."""
    parser, d = resumable_parser(
        "candle-yolo-v8 train",
        "Fine-tune a YOLOv8 detector on a data.yaml (ultralytics' recipe and "
        "augmentations); writes <run>/weights/best.safetensors.", suppress)
    parser.add_argument("--data", metavar="YAML", help="data.yaml: path, train, val, names "
                        "(required unless --resume)")
    parser.add_argument("--weights", metavar="FILE", help="YOLOv8 detector safetensors to start "
                        "from (default: candle's published yolov8{variant})")
    parser.add_argument("--variant", choices=tuple(MULTIPLES),
                        help="model size (default: what --weights holds, else n)")
    parser.add_argument("--epochs", type=positive(int), metavar="N", **d(100),
                        help="default 100")
    parser.add_argument("--imgsz", type=yolo_input_size, metavar="PX", **d(640),
                        help="square training input side, a multiple of 32 (default 640)")
    parser.add_argument("--batch", type=positive(int), metavar="N", **d(16),
                        help="images per batch (default 16; gradients are summed to 64; under "
                             "mlx.launch the batch of all processes together)")
    parser.add_argument("--optimizer", type=_optimizer, metavar="NAME", **d("auto"),
                        help="auto (ultralytics': AdamW for short runs, else SGD), SGD or AdamW")
    parser.add_argument("--lr0", type=positive(float), metavar="LR", **d(0.01),
                        help="initial learning rate for SGD/AdamW (auto picks its own; "
                             "default 0.01)")
    parser.add_argument("--close-mosaic", type=non_negative, metavar="N", **d(10),
                        help="epochs at the end without mosaic (default 10)")
    parser.add_argument("--warmup-epochs", type=non_negative, metavar="N", **d(3),
                        help="warm-up epochs (never the last epoch; 0: none; default 3)")
    parser.add_argument("--nbs", type=positive(int), metavar="N", **d(64),
                        help="nominal batch: gradients of round(N / --batch) batches are summed "
                             "into one step, weight decay scaled to it (default 64)")
    parser.add_argument("--freeze-bn", action="store_true", **d(False),
                        help="BatchNorm keeps the pretrained running statistics (its scale and "
                             "shift still learn): better for short fine-tuning on small sets")
    parser.add_argument("--seed", type=non_negative, metavar="N", **d(0),
                        help="seed of the new head, data order and augmentation (default 0)")
    parser.add_argument("--project", metavar="DIR", **d("runs/detect"),
                        help="folder of runs (default runs/detect)")
    parser.add_argument("--name", metavar="NAME", **d("train"), help="run name (default train)")
    parser.add_argument("--out", metavar="DIR", help="the run folder itself (instead of "
                        "--project/--name)")
    parser.add_argument("--resume", action="store_true", **d(False),
                        help="continue the run in --out (or --project/--name) from its last "
                             "finished epoch")
    parser.add_argument("--workers", type=positive(int), metavar="N", **d(4),
                        help="threads preparing the images (default 4)")
    parser.add_argument("--stop-after", type=positive(int), metavar="N",
                        help="stop after N epochs of this invocation (continue with --resume)")
    parser.add_argument("--no-progress", action="store_true", **d(False),
                        help="no progress bar")
    add_device_argument(parser)
    return parser


def _run_folder(args: argparse.Namespace) -> Path:
    if args.out:
        return Path(args.out)
    base = Path(args.project) / args.name
    if args.resume or not base.exists():
        return base
    n = 2
    while (base.parent / f"{base.name}{n}").exists():
        n += 1
    return base.parent / f"{base.name}{n}"


def _start_tensors(args: argparse.Namespace, nc: int) -> tuple[dict, str]:
    """The starting detector's tensors (candle's layout), its class branch re-initialised for
    ``nc`` classes when it has another count; and its variant."""
    path = resolve_weights("yolo_v8", args.variant or "n", args.weights)
    vb = VarBuilder.from_safetensors(path)
    if vb.contains(YOLO11_STEM):
        raise CandleNNError(f"{shown(path)} holds a YOLO11 model; `train` fine-tunes YOLOv8 only "
                            "(YOLO11 runs in predict and val): pass YOLOv8 weights with --weights")
    try:
        spec = infer_spec(vb, name=str(path))
    except WeightsFileError as exc:
        raise WeightsFileError(f"{exc}. Pass YOLOv8 detection weights with --weights") from None
    if args.variant and args.variant != spec.variant:
        raise CandleNNError(f"{shown(path)} holds {spec}, not --variant {args.variant}: drop "
                            "--variant or pass matching --weights")
    if spec.task == "classify":
        raise CandleNNError(f"{shown(path)} holds {spec}, a classifier without a detection head: "
                            "pass YOLOv8 detection (or pose/segment) weights with --weights")
    # a pose or segmentation checkpoint starts a detector: its keypoint/mask branches are left
    tensors = {k: v for k, v in mx.load(str(path)).items()
               if not k.startswith(("head.cv4.", "head.proto."))}
    if spec.num_classes != nc:
        tensors = new_class_head(tensors, nc, args.seed)
    return tensors, spec.variant


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    given = vars(build_parser(suppress=True).parse_args(argv))
    out = _run_folder(args)
    if args.resume:
        extra = sorted(set(given) - RESUME_MAY_SET)
        if extra:
            parser.error(f"--resume continues the run with its saved settings: drop "
                         f"{', '.join('--' + e.replace('_', '-') for e in extra)}")
        _, meta = read_checkpoint(out / "weights" / CHECKPOINT)
        saved = meta["run"] if isinstance(meta["run"], dict) else {}
        if not {"data", "variant"} <= set(saved) or not isinstance(meta["config"], dict):
            raise CandleNNError(f"{out / 'weights' / CHECKPOINT} was not written by "
                                "candle-yolo-v8 train: it does not record the data and variant "
                                "to resume with (start the run again without --resume)")
        config = TrainConfig.from_dict(meta["config"])
        if meta["epoch"] >= config.epochs:
            raise CandleNNError(f"the run in {out} already finished its {config.epochs} epochs; "
                                f"nothing to resume (its best weights: "
                                f"{out / 'weights' / BEST})")
        data_path, variant = saved["data"], saved["variant"]
    else:
        if not args.data:
            parser.error("--data is required (or --resume to continue a run)")
        refuse_existing_run(out, RUN_FILES)
        config = TrainConfig(epochs=args.epochs, batch=args.batch, imgsz=args.imgsz,
                             optimizer=args.optimizer, lr0=args.lr0,
                             close_mosaic=args.close_mosaic, warmup_epochs=args.warmup_epochs,
                             nbs=args.nbs, freeze_bn=args.freeze_bn, seed=args.seed)
        data_path, variant = str(Path(args.data).resolve()), None
    group = mx.distributed.init()
    main_rank = group.rank() == 0
    if main_rank:
        check_run_unheld(out, TOOL)
    device = parse_device(args.device, args.verbose and main_rank)

    def warn(message: str) -> None:
        if main_rank:
            print(f"warning: {message}", file=sys.stderr)

    try:
        data = DataConfig.load(data_path)
        train = DetectionDataset(data.images("train"), data.names, config.imgsz,
                                 augment=True, seed=config.seed, warn=warn,
                                 cache=data.cache_path("train"))
        val = DetectionDataset(data.images("val"), data.names, config.imgsz, augment=False,
                               warn=warn, cache=data.cache_path("val"))
    except DataError as exc:
        raise CandleNNError(str(exc)) from None
    for split, ds in (("train", train), ("val", val)):
        if not len(ds):
            raise CandleNNError(f"{data.path}: no usable images in {split} (see the warnings)")
    # as ultralytics' data loader: a batch is at most the whole set (the nominal --batch still
    # sets the accumulation and the weight decay)
    batch = capped_batch(config.batch, len(train), group.size())
    if not config.freeze_bn:
        check_batch_norm_batch(batch, group.size(), config.imgsz, "--batch")
    nc = len(data.names)
    if args.resume:
        tensors = None  # the weights come from the checkpoint: build from the variant alone
    else:
        tensors, variant = _start_tensors(args, nc)
    model, ema = (_build(tensors, variant, nc, device) for _ in range(2))
    if batch != config.batch:  # once the weights are known good
        warn(f"--batch {config.batch} is more than the {len(train)} training images; each batch "
             f"takes all {batch}")
    metadata = WeightsMetadata(model="yolo_v8", variant=variant, task="detect",
                               num_classes=nc, names=data.names).to_dict()
    trainer = DetectionTrainer(model, ema, config, train, val, out, metadata=metadata,
                               workers=args.workers, progress=not args.no_progress,
                               run_info={"data": data_path, "variant": variant},
                               log=lambda line: print(line, file=sys.stderr, flush=True),
                               group=group, compile=_compiled(args.compile, device))
    with hold_run(out, TOOL, main_rank, () if args.resume else RUN_FILES):
        if args.resume:
            trainer.resume(out / "weights" / CHECKPOINT)
        if main_rank:
            print(f"training {model.spec} on {len(train)} images ({len(val)} to validate), "
                  f"{trainer.name} lr0 {trainer.lr0:g}"
                  + (f", {group.size()} processes" if group.size() > 1 else "")
                  + f", {trainer.nb} batches per epoch, run folder {out}"
                  + (f"; resuming after epoch {trainer.epoch}" if args.resume else ""),
                  file=sys.stderr, flush=True)
        trainer.fit(stop_after=args.stop_after)
    if main_rank:
        print(json.dumps({"run": str(out), "epochs_done": trainer.epoch,
                          "best": str(out / "weights" / BEST),
                          "best_fitness": trainer.best_fitness}))
    return 0


def _compiled(choice: str, device) -> bool:
    """``--compile``: ``auto`` compiles the training step on GPUs only."""
    enabled = compile_choice(choice)
    return device.kind == "gpu" if enabled is None else enabled


def _build(tensors: dict | None, variant: str, nc: int, device) -> YoloV8:
    if tensors is None:
        from candle_nn import VarMap

        vb = VarBuilder.from_varmap(VarMap(), device=device)
    else:
        vb = VarBuilder.from_tensors(tensors, device=device)
    return YoloV8.load(vb, variant, num_classes=nc, fold_bn=False)


def main(argv: Sequence[str] | None = None) -> int:
    """``candle-yolo-v8 train ...``."""
    return run_main(_main, argv)
