"""Fine-tuning a YOLOv8 detector with ultralytics' recipe (``DetectionTrainer`` defaults).

* Optimizer: ``auto`` picks AdamW (lr ``round(0.002 * 5 / (4 + nc), 6)``, beta1 0.9, no bias
  warm-up) for under 10 000 iterations, else SGD (lr 0.01, momentum 0.9); ``SGD`` is Nesterov with
  momentum 0.937 and ``lr0``; ``AdamW`` uses ``lr0`` and beta1 0.937 (PyTorch's: bias-corrected).
  Three parameter groups as ultralytics: convolution weights (decay ``5e-4 * batch * accumulate
  / 64``), BatchNorm weights and all biases (no decay); the DFL projection is frozen.
* Gradients of ``accumulate = round(64 / batch)`` batches are summed before a step (clipped to
  norm 10), ``accumulate`` capped at the run's batch count. Warm-up over ``round(3 epochs)`` of
  iterations (at most all epochs but the last): learning rates rise linearly from 0 (biases: from
  0.1) and SGD's momentum from 0.8, the accumulation from 1 batch; after it, the learning rate
  decays linearly to ``lrf = 0.01`` of ``lr0`` over the epochs.
* An exponential moving average of the weights (ultralytics' ``ModelEMA``: decay
  ``0.9999 * (1 - exp(-updates / 2000))``, BatchNorm statistics included) is what is validated
  and saved.
* Mosaic is used except in the last ``close_mosaic`` epochs.
* ``freeze_bn`` (not ultralytics'): BatchNorm normalises with its running statistics in training
  too (its scale and shift still learn). Short fine-tuning runs on small sets gain: with
  ultralytics' batch statistics the running statistics (momentum 0.03) trail the trained weights
  for hundreds of steps, and validation in eval mode scores far below what the model has learnt.

A run folder holds ``weights/last.safetensors`` and ``weights/best.safetensors`` (the EMA weights
in candle's layout, with the class names, loadable by ``candle-yolo-v8 --weights``),
``weights/checkpoint.safetensors`` (model, EMA, optimizer state, summed gradients and counters to
resume), ``results.csv`` (ultralytics' columns) and ``results.png``. Each file is written whole
or not at all; the checkpoint last, so an interrupted run resumes from its last finished epoch
and ends bit-identical to an uninterrupted run (every random draw comes from generators seeded by
``(seed, epoch[, image])``; the gradient norm is summed in an order that does not depend on how
an array lies in memory, see :func:`clip_grad_norm`).

Data parallelism (``mlx.launch``, ``models/data_parallel.py``, as the classifier trainer): each
batch is ``config.batch`` images of the shuffled order (the same on every rank); rank ``r`` of
``W`` prepares and runs its ``batch / W`` of them. The loss divides by the whole batch's total
target score (one small all-reduce) and scales by the whole batch's size, the gradients are
summed over the ranks every batch, so every rank holds the same gradient sum, takes the same
step and keeps the same EMA. With BatchNorm statistics frozen (``freeze_bn``) this is the
one-process run on the whole batch; in train mode each rank normalises with its own batch
statistics (as ultralytics' DDP). Rank 0 alone validates, writes the files and logs.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping

import candle_nn as cn
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten
import numpy as np

from candle_nn.atomic_write import atomic_write
from candle_nn.checkpoint import write_safetensors

from . import train_checkpoint
from .data_parallel import DataParallel
from .divergence import check_finite_losses, check_finite_parameters
from .image_loader import BatchLoader
from .yolo_v8 import YoloV8
from .yolo_v8_dataset import DetectionDataset, collate
from .yolo_v8_head import STRIDES
from .yolo_v8_loss import DetectionLoss, check_targets
from .yolo_v8_metrics import DetectionResults
from .yolo_v8_post import xywh_to_xyxy
from .yolo_v8_validator import Validator

__all__ = ["TrainConfig", "DetectionTrainer", "clip_grad_norm", "new_class_head",
           "resolve_optimizer", "RESULTS_COLUMNS"]

CHECKPOINT, LAST, BEST = "checkpoint.safetensors", "last.safetensors", "best.safetensors"
TARGET_ROWS = 64  # the compiled step's ground-truth rows come in multiples of this
STATE_KEY = "candle_nn.yolo_train_state"
STATE_FIELDS = ("config", "epoch", "updates", "last_opt_step", "accumulate", "best_fitness",
                "history", "names", "run", "momentum")  # see DetectionTrainer.state()
GROUPS = ("weight", "bn", "bias")  # ultralytics' param_groups order (lr/pg0, pg1, pg2)
RESULTS_COLUMNS = ("epoch", "time", "train/box_loss", "train/cls_loss", "train/dfl_loss",
                   "metrics/precision(B)", "metrics/recall(B)", "metrics/mAP50(B)",
                   "metrics/mAP50-95(B)", "val/box_loss", "val/cls_loss", "val/dfl_loss",
                   "lr/pg0", "lr/pg1", "lr/pg2")


@dataclass(frozen=True)
class TrainConfig:
    """ultralytics' training hyperparameters (``default.yaml``) that this trainer uses."""

    epochs: int = 100
    batch: int = 16
    imgsz: int = 640
    optimizer: str = "auto"  # auto, SGD, AdamW
    lr0: float = 0.01
    lrf: float = 0.01
    momentum: float = 0.937
    weight_decay: float = 5e-4
    warmup_epochs: float = 3.0
    warmup_momentum: float = 0.8
    warmup_bias_lr: float = 0.1
    nbs: int = 64
    close_mosaic: int = 10
    max_norm: float = 10.0
    freeze_bn: bool = False  # BatchNorm normalises with its running statistics in training too
    seed: int = 0

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


def resolve_optimizer(config: TrainConfig, num_classes: int,
                      num_images: int) -> tuple[str, float, float, float]:
    """``(name, lr0, momentum, warmup_bias_lr)`` as ultralytics' ``build_optimizer`` picks them."""
    if config.optimizer.lower() != "auto":
        name = {"sgd": "SGD", "adamw": "AdamW"}[config.optimizer.lower()]
        return name, config.lr0, config.momentum, config.warmup_bias_lr
    iterations = math.ceil(num_images / max(config.batch, config.nbs)) * config.epochs
    if iterations > 10000:
        return "SGD", 0.01, 0.9, 0.0
    return "AdamW", round(0.002 * 5 / (4 + num_classes), 6), 0.9, 0.0


def new_class_head(tensors: Mapping[str, mx.array], num_classes: int,
                   seed: int) -> dict[str, mx.array]:
    """``tensors`` (a detector in candle's names and layout) with a class branch for
    ``num_classes``, as ultralytics builds it and keeps only the pretrained tensors of matching
    shapes: each ``head.cv3.{i}`` layer whose shape changes (the last 1x1 convolution always; the
    two 3x3 blocks too when the branch width ``max(c3, min(nc, 100))`` changes) is new —
    convolution weights drawn as PyTorch's default init (uniform ±1/sqrt(fan_in), seeded),
    BatchNorms at identity — and the class biases are ``log(5 / nc / (640 / s)^2)``
    (ultralytics' ``Detect.bias_init``; the box branch keeps its trained biases)."""
    out = dict(tensors)
    rng = np.random.default_rng([seed, 24])
    c_in0 = int(tensors["head.cv2.0.0.conv.weight"].shape[1])  # the neck's p3 channels
    width = max(c_in0, min(num_classes, 100))

    def conv(name: str, c_out: int, c_in: int, k: int) -> None:
        if name in out and tuple(out[name].shape) == (c_out, c_in, k, k):
            return
        bound = 1 / math.sqrt(c_in * k * k)
        out[name] = mx.array(rng.uniform(-bound, bound, (c_out, c_in, k, k)).astype(np.float32))

    for i, stride in enumerate(STRIDES):
        p = f"head.cv3.{i}"
        c_in = int(tensors[f"head.cv2.{i}.0.conv.weight"].shape[1])
        for j, cin in ((0, c_in), (1, width)):
            name = f"{p}.{j}.conv.weight"
            if tuple(out[name].shape) != (width, cin, 3, 3):
                conv(name, width, cin, 3)
                out[f"{p}.{j}.bn.weight"] = mx.ones((width,))
                out[f"{p}.{j}.bn.bias"] = mx.zeros((width,))
                out[f"{p}.{j}.bn.running_mean"] = mx.zeros((width,))
                out[f"{p}.{j}.bn.running_var"] = mx.ones((width,))
        out.pop(f"{p}.2.weight")
        conv(f"{p}.2.weight", num_classes, width, 1)
        prior = math.log(5 / num_classes / (640 / stride) ** 2)
        out[f"{p}.2.bias"] = mx.full((num_classes,), prior, dtype=mx.float32)
    return out


def clip_grad_norm(grads: Mapping[str, mx.array], max_norm: float) -> dict[str, mx.array]:
    """``grads`` scaled by ``min(1, max_norm / (norm + 1e-6))`` (PyTorch's ``clip_grad_norm_``),
    the norm summed over each array in row-major order: MLX sums an array in its memory order,
    which differs between a computed gradient (often a transposed view) and the same values read
    back from a checkpoint, and a resumed run must round as the uninterrupted one."""
    total = mx.sqrt(sum(mx.square(mx.contiguous(g).reshape(-1)).sum() for g in grads.values()))
    scale = mx.minimum(max_norm / (total + 1e-6), 1.0)
    return {k: g * scale for k, g in grads.items()}


def _group_of(name: str) -> str:
    if name.endswith(".bias"):
        return "bias"
    return "bn" if ".bn." in name else "weight"


def _flat(tree: Any) -> dict[str, mx.array]:
    return dict(tree_flatten(tree))


class DetectionTrainer:
    """Train ``model`` (a :class:`YoloV8` built with ``fold_bn=False``) on ``train``, validating
    the EMA on ``val`` after each epoch; files go to ``out`` (see the module docstring).

    Args:
        model, ema: two instances of the same detector (``ema`` starts as a copy of ``model``).
        metadata: safetensors metadata of the saved weights (class names, variant).
        workers: sample-preparing threads. log: where the per-epoch lines go.
        run_info: what else the checkpoint records (the CLI's data file and variant).
        group: the ``mx.distributed`` group (``None``: ``mx.distributed.init()``; see the
            module docstring's data parallelism).
        compile: run each batch's forward and backward under ``mx.compile`` (the model's
            parameters and BatchNorm statistics as its state; ground truth padded to
            :data:`TARGET_ROWS`-row and 8-slot multiples so that few shapes are traced). The
            same numbers as eager; faster on GPUs, where the fused kernels win, while the CPU
            builds C++ for minutes on the first batch of each shape.
    """

    def __init__(self, model: YoloV8, ema: YoloV8, config: TrainConfig, train: DetectionDataset,
                 val: DetectionDataset, out: Path, *, metadata: Mapping[str, str] | None = None,
                 workers: int = 4, log: Callable[[str], None] = print,
                 progress: bool = False, run_info: Mapping[str, Any] | None = None,
                 group: "mx.distributed.Group | None" = None, compile: bool = False) -> None:
        self.model, self.ema, self.config = model, ema, config
        self.dp = DataParallel(group)
        self.dp.check_batch(config.batch, "--batch")
        self.train_set, self.val_set, self.out = train, val, Path(out)
        self.metadata = dict(metadata or {})
        self.run_info = dict(run_info or {})
        self.workers, self.log, self.progress = max(1, workers), log, progress
        self.nc = model.spec.num_classes
        self.criterion = DetectionLoss(self.nc, group=self.dp.group)  # over the global batch
        self.val_criterion = DetectionLoss(self.nc)  # rank 0 validates alone
        model.head.dfl.freeze()  # ultralytics never trains the DFL projection
        if config.freeze_bn:
            cn.freeze_bn_stats(model)
            cn.freeze_bn_stats(ema)
        self.name, self.lr0, momentum, self.warmup_bias_lr = resolve_optimizer(
            config, self.nc, len(train))
        self.momentum = momentum
        full, rest = divmod(len(train), config.batch)
        self.nb = full + (rest >= self.dp.world)  # batches an epoch (see batches())
        accumulate = max(round(config.nbs / config.batch), 1)
        decay = config.weight_decay * config.batch * accumulate / config.nbs
        self.acc0 = min(accumulate, self.nb * config.epochs)  # the nominal, capped to the run
        self.accumulate = self.acc0
        self.optimizers = {g: self._make_optimizer(decay if g == "weight" else 0.0)
                           for g in GROUPS}
        names = [k for k, _ in tree_flatten(model.trainable_parameters())]
        self.groups = {g: [n for n in names if _group_of(n) == g] for g in GROUPS}
        warmup = min(config.warmup_epochs, max(config.epochs - 1, 0))  # the last epoch is not
        self.nw = round(warmup * self.nb) if warmup > 0 else 0
        self.epoch = 0  # finished epochs
        self.updates = 0  # EMA updates (= optimizer steps)
        self.last_opt_step = -1
        self.grads: dict[str, mx.array] | None = None  # summed since the last step
        self.best_fitness: float | None = None
        self.history: list[dict[str, float]] = []
        self._loss_and_grad = nn.value_and_grad(model, self._loss)
        self.compiled = compile
        self._step = self._eager_step
        if compile:
            self._step = mx.compile(self._eager_step, inputs=[model.state],
                                    outputs=[model.state])

    def _make_optimizer(self, decay: float) -> optim.Optimizer:
        if self.name == "SGD":
            return optim.SGD(self.lr0, momentum=self.momentum, weight_decay=decay, nesterov=True)
        return optim.AdamW(self.lr0, betas=[self.momentum, 0.999], weight_decay=decay,
                           bias_correction=True)

    def lf(self, epoch: int) -> float:
        """The linear schedule's factor of ``lr0`` in ``epoch`` (0-based)."""
        c = self.config
        return max(1 - epoch / c.epochs, 0) * (1.0 - c.lrf) + c.lrf

    # -- one iteration ------------------------------------------------------------------------

    def _loss(self, model: YoloV8, x: mx.array, targets: "np.ndarray | mx.array",
              batch_size: int, max_boxes: int | None) -> tuple[mx.array, mx.array]:
        return self.criterion(model(x), targets, max_boxes=max_boxes, batch_size=batch_size)

    def _eager_step(self, x: mx.array, targets: "np.ndarray | mx.array", batch_size: int,
                    max_boxes: int | None) -> tuple[mx.array, dict]:
        (_, items), grads = self._loss_and_grad(self.model, x, targets, batch_size, max_boxes)
        return items, grads

    def _fixed_shapes(self, targets: np.ndarray, batch: int) -> tuple[mx.array, int]:
        """``targets`` checked, padded with rows of image -1 to a multiple of
        :data:`TARGET_ROWS`, and the slots per image (the fullest image's count rounded up to
        8): the compiled step's inputs."""
        check_targets(targets, batch, self.nc)
        rows = -(-max(len(targets), 1) // TARGET_ROWS) * TARGET_ROWS
        padded = np.zeros((rows, 6), np.float32)
        padded[:, 0] = -1
        padded[:len(targets)] = targets
        image = targets[:, 0].astype(np.int64)
        fullest = int(np.bincount(image, minlength=1).max()) if len(image) else 0
        return mx.array(padded), max(-(-fullest // 8) * 8, 8)

    def _set_hyper(self, ni: int, epoch: int) -> None:
        """ultralytics' warm-up: learning rates, momentum and accumulation at iteration ``ni``."""
        c = self.config
        if not (self.nw and ni <= self.nw):
            for opt in self.optimizers.values():
                opt.learning_rate = self.lr0 * self.lf(epoch)
            return
        xi = [0, self.nw]
        self.accumulate = max(1, int(np.interp(ni, xi, [1, self.acc0]).round()))
        for g, opt in self.optimizers.items():
            start = self.warmup_bias_lr if g == "bias" else 0.0
            opt.learning_rate = float(np.interp(ni, xi, [start, self.lr0 * self.lf(epoch)]))
            if self.name == "SGD":
                opt.momentum = float(np.interp(ni, xi, [c.warmup_momentum, self.momentum]))

    def iteration(self, ni: int, epoch: int, x: mx.array, targets: np.ndarray,
                  batch_size: int | None = None) -> mx.array:
        """Forward/backward one batch (this rank's part ``x`` of a global batch of
        ``batch_size`` images, default ``len(x)``), step when ``accumulate`` batches are summed;
        returns the global batch's loss items ``(3,)``."""
        self._set_hyper(ni, epoch)
        self.model.train()
        b = x.shape[0] if batch_size is None else batch_size
        if self.compiled:
            padded, max_boxes = self._fixed_shapes(targets, x.shape[0])
            items, grads = self._step(x, padded, b, max_boxes)
        else:
            items, grads = self._step(x, targets, b, None)
        grads = self.dp.sum_gradients(_flat(grads))
        items = self.dp.all_sum(items)
        self.grads = grads if self.grads is None else {k: self.grads[k] + v
                                                       for k, v in grads.items()}
        if ni - self.last_opt_step >= self.accumulate:
            self.optimizer_step()
            self.last_opt_step = ni
        mx.eval(items, self.model.parameters(), self.grads if self.grads is not None else [])
        return items

    def optimizer_step(self) -> None:
        """Clip the summed gradients to norm ``max_norm``, update each group, update the EMA."""
        grads = clip_grad_norm(self.grads, self.config.max_norm)
        params = _flat(self.model.parameters())
        new: dict[str, mx.array] = {}
        for g, opt in self.optimizers.items():
            names = self.groups[g]
            new.update(opt.apply_gradients({n: grads[n] for n in names},
                                           {n: params[n] for n in names}))
        self.model.update(tree_unflatten(list(new.items())))
        self.grads = None
        self.updates += 1
        d = 0.9999 * (1 - math.exp(-self.updates / 2000))
        ours = _flat(self.model.parameters())
        self.ema.update(tree_unflatten([(k, v * d + (1 - d) * ours[k])
                                        for k, v in _flat(self.ema.parameters()).items()]))
        mx.eval(self.model.parameters(), self.ema.parameters(),
                [o.state for o in self.optimizers.values()])

    # -- epochs -------------------------------------------------------------------------------

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's image indices of each batch of ``epoch``: a seeded shuffle cut into
        global batches of ``config.batch`` (the last one partial; dropped when it has fewer
        images than there are ranks), each split over the ranks."""
        order = np.random.default_rng([self.config.seed, epoch]).permutation(len(self.train_set))
        b = self.config.batch
        return [self.dp.share(order[i:i + b]) for i in range(0, len(order), b)][:self.nb]

    def batch_sizes(self) -> list[int]:
        """The global size of each batch of an epoch."""
        b = self.config.batch
        return [min(b, len(self.train_set) - i * b) for i in range(self.nb)]

    def train_epoch(self, epoch: int, pool: ThreadPoolExecutor) -> np.ndarray:
        """One epoch; returns the mean (box, cls, dfl) loss items."""
        from tqdm import tqdm

        c = self.config
        mosaic = epoch < c.epochs - c.close_mosaic
        loader = BatchLoader(self.batches(epoch),
                             lambda i: self.train_set.sample(i, epoch, mosaic), collate, pool)
        mx.random.seed(int(np.random.default_rng([c.seed, epoch]).integers(2 ** 63)))
        total, seen = np.zeros(3), 0
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{c.epochs}", unit="batch",
                   disable=not (self.progress and self.dp.is_main), dynamic_ncols=True,
                   leave=False)
        sizes = self.batch_sizes()
        for i, (x, targets) in enumerate(bar):
            items = self.iteration(i + self.nb * epoch, epoch, mx.array(x), targets, sizes[i])
            items = np.asarray(items, dtype=np.float64)
            check_finite_losses(items, epoch, "training (box, cls, dfl)", "--lr0", self.lr0)
            total += items
            seen += 1
            bar.set_postfix(box=f"{total[0] / seen:.3f}", cls=f"{total[1] / seen:.3f}",
                            dfl=f"{total[2] / seen:.3f}")
        bar.close()
        return total / max(seen, 1)

    def validate(self, pool: ThreadPoolExecutor) -> tuple[DetectionResults, np.ndarray]:
        """The EMA's metrics and mean loss items on the validation set: its letterboxed samples
        through the one :class:`~candle_nn_models.yolo.val.Validator` (conf 0.001, IoU 0.7,
        300 detections an image: ultralytics' validation)."""
        ema, validator = self.ema, Validator(self.train_set.names)
        ema.eval()
        total, seen = np.zeros(3), 0
        b = self.config.batch
        indices = np.arange(len(self.val_set))
        batches = [indices[i:i + b] for i in range(0, len(indices), b)]
        s = self.config.imgsz
        for x, targets in BatchLoader(batches, lambda i: self.val_set.sample(i, 0, False),
                                      collate, pool):
            feats = list(ema.fpn(*ema.net(mx.array(x))))
            raw = ema.head.raw(feats)
            pred = ema.head(feats).transpose(0, 2, 1)
            _, items = self.val_criterion(raw, targets)
            total += np.asarray(items, dtype=np.float64)
            seen += 1
            labels = [targets[targets[:, 0] == j] for j in range(len(x))]
            validator.update(np.asarray(pred), [(xywh_to_xyxy(mine[:, 2:6] * s),
                                                 mine[:, 1].astype(np.int64)) for mine in labels])
        return validator.results(), total / max(seen, 1)

    def fit(self, stop_after: int | None = None) -> list[dict[str, float]]:
        """Train from the current epoch to ``config.epochs`` (or ``stop_after`` more epochs).
        Rank 0 validates, writes and logs; the other ranks train only."""
        if self.dp.is_main:
            (self.out / "weights").mkdir(parents=True, exist_ok=True)
        last = self.config.epochs if stop_after is None else min(self.config.epochs,
                                                                  self.epoch + stop_after)
        with ThreadPoolExecutor(self.workers, thread_name_prefix="candle-nn-yolo-data") as pool, \
                self.model.on_device():
            for epoch in range(self.epoch, last):
                start = time.perf_counter()
                train_items = self.train_epoch(epoch, pool)
                # nothing of a diverged epoch is written: the folder keeps the last good one
                check_finite_parameters([self.model.parameters(), self.ema.parameters()], epoch,
                                        "--lr0", self.lr0)
                self.epoch = epoch + 1
                if self.dp.is_main:
                    self._end_epoch(epoch, train_items, start, pool)
        return self.history

    def _end_epoch(self, epoch: int, train_items: np.ndarray, start: float,
                   pool: ThreadPoolExecutor) -> None:
        """Validate the EMA, record the epoch, write the files, log the line."""
        lrs = [float(self.optimizers[g].learning_rate) for g in GROUPS]
        results, val_items = self.validate(pool)
        check_finite_losses(val_items, epoch, "validation (box, cls, dfl)", "--lr0", self.lr0)
        score = results.fitness
        row = {"epoch": epoch + 1, "time": 0.0,
               "train/box_loss": train_items[0], "train/cls_loss": train_items[1],
               "train/dfl_loss": train_items[2],
               "metrics/precision(B)": results.all.p, "metrics/recall(B)": results.all.r,
               "metrics/mAP50(B)": results.all.map50,
               "metrics/mAP50-95(B)": results.all.map50_95,
               "val/box_loss": val_items[0], "val/cls_loss": val_items[1],
               "val/dfl_loss": val_items[2],
               "lr/pg0": lrs[0], "lr/pg1": lrs[1], "lr/pg2": lrs[2]}
        seconds = time.perf_counter() - start
        row["time"] = (self.history[-1]["time"] if self.history else 0.0) + seconds
        self.history.append({k: float(v) for k, v in row.items()})
        improved = self.best_fitness is None or score > self.best_fitness
        if improved:
            self.best_fitness = score
        self.save(improved)
        self.log(f"epoch {epoch + 1}/{self.config.epochs}: loss box "
                 f"{train_items[0]:.3f} cls {train_items[1]:.3f} dfl "
                 f"{train_items[2]:.3f} | P {results.all.p:.3f} R {results.all.r:.3f} "
                 f"mAP50 {results.all.map50:.3f} mAP50-95 {results.all.map50_95:.3f}"
                 f"{' (best)' if improved else ''} | {seconds:.1f} s")

    # -- files --------------------------------------------------------------------------------

    def save(self, improved: bool) -> None:
        """last (and best) weights, results.csv, the plot, then the checkpoint."""
        weights = self.out / "weights"
        cn.save_safetensors(self.ema, weights / LAST, self.metadata)
        if improved:
            cn.save_safetensors(self.ema, weights / BEST, self.metadata)
        self._write_text(self.out / "results.csv", _results_csv(self.history))
        try:
            from .yolo_v8_plot import plot_results

            with atomic_write(self.out / "results.png", suffix=".png") as tmp:
                plot_results(self.history, tmp)
        except OSError as exc:
            self.log(f"warning: cannot write {self.out / 'results.png'}: {exc}")
        tensors, meta = self.state()
        write_safetensors(weights / CHECKPOINT, tensors, meta)

    def _write_text(self, path: Path, text: str) -> None:
        try:
            with atomic_write(path) as tmp:
                tmp.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise cn.CandleNNError(f"cannot write {path}: {exc.strerror or exc}") from exc

    def state(self) -> tuple[dict[str, mx.array], dict[str, str]]:
        """Everything to resume: ``model/``, ``ema/``, ``opt/<group>/`` and ``grad/`` tensors;
        counters, history and configuration in the metadata."""
        tensors = {f"model/{k}": v for k, v in _flat(self.model.parameters()).items()}
        tensors.update({f"ema/{k}": v for k, v in _flat(self.ema.parameters()).items()})
        for g, opt in self.optimizers.items():
            for k, v in opt.state.items():
                if isinstance(v, dict):
                    tensors.update({f"opt/{g}/{k}/{sk}": sv for sk, sv in v.items()})
                else:
                    tensors[f"opt/{g}/{k}"] = v
        if self.grads is not None:
            tensors.update({f"grad/{k}": v for k, v in self.grads.items()})
        meta = {"format": 1, "config": asdict(self.config), "epoch": self.epoch,
                "updates": self.updates, "last_opt_step": self.last_opt_step,
                "accumulate": self.accumulate, "best_fitness": self.best_fitness,
                "history": self.history, "names": self.train_set.names, "run": self.run_info,
                "momentum": {g: float(getattr(o, "momentum", 0.0))
                             for g, o in self.optimizers.items()}}
        return tensors, {STATE_KEY: json.dumps(meta)}

    def resume(self, path: "str | os.PathLike") -> None:
        """Restore a :meth:`state` checkpoint."""
        tensors, meta = read_checkpoint(path)
        if meta["names"] != self.train_set.names:
            raise cn.CandleNNError(f"{path} was trained on classes {meta['names']}, but the data "
                                   f"now names {self.train_set.names}")

        def part(prefix: str) -> list[tuple[str, mx.array]]:
            return [(k[len(prefix):], v) for k, v in tensors.items() if k.startswith(prefix)]

        self.model.update(tree_unflatten(part("model/")))
        self.ema.update(tree_unflatten(part("ema/")))
        for g, opt in self.optimizers.items():
            state: dict[str, Any] = {}
            for k, v in part(f"opt/{g}/"):
                if "/" in k:
                    name, sk = k.rsplit("/", 1)
                    state.setdefault(name, {})[sk] = v
                else:
                    state[k] = v
            opt.state = state
            if self.name == "SGD":
                opt.momentum = meta["momentum"][g]
        grads = dict(part("grad/"))
        self.grads = grads or None
        self.epoch, self.updates = int(meta["epoch"]), int(meta["updates"])
        self.last_opt_step, self.accumulate = int(meta["last_opt_step"]), int(meta["accumulate"])
        self.best_fitness, self.history = meta["best_fitness"], meta["history"]
        mx.eval(self.model.parameters(), self.ema.parameters())


def read_checkpoint(path: "str | os.PathLike") -> tuple[dict[str, mx.array], dict[str, Any]]:
    """A YOLOv8 training checkpoint's tensors and state (CandleNNError when absent or
    unreadable)."""
    return train_checkpoint.read_checkpoint(path, STATE_KEY, "YOLOv8 training", STATE_FIELDS)


def _results_csv(history: list[dict[str, float]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(RESULTS_COLUMNS)
    for row in history:
        writer.writerow([int(row["epoch"])] + [f"{row[c]:.6g}" for c in RESULTS_COLUMNS[1:]])
    return buf.getvalue()

