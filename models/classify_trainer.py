"""Training an image classifier on an :class:`~candle_nn_models.image_folder.ImageFolder`: the
epoch loop, validation, checkpoints that resume exactly, and data parallelism over
``mx.distributed``.

A run folder holds::

    labels.txt               class names, one a line, in the classifier's index order
    best.safetensors         the weights of the best validation accuracy so far (candle's layout)
    checkpoint.safetensors   everything to resume after the last finished epoch
    results.csv              one row per finished epoch

Every file is written whole or not at all (a temporary file renamed onto it), ``best`` before
``checkpoint``: a run stopped at any moment resumes from its last finished epoch, and a resumed
run ends with the weights an uninterrupted one would have. The checkpoint holds the model's
parameters and BatchNorm statistics (``model.*``), the optimizer's state (``optimizer.*``: moments,
step count) and, in its metadata, the configuration, epoch and history. Random state needs no
saving: the data order and every augmentation are drawn from NumPy generators seeded by
``(seed, epoch)`` and ``(seed, epoch, image index)``, and MLX's global key (dropout, say) is
re-seeded from ``(seed, epoch)`` when each epoch starts.

Data parallelism (``mlx.launch``): each step takes ``batch_size`` images of the shuffled order (the
same on every rank); rank ``r`` of ``W`` decodes and runs its ``batch_size / W`` of them, the
gradients are averaged with ``mlx.nn.average_gradients``, and every rank applies the same update.
With BatchNorm statistics frozen this is the single-process step on the whole batch; in train mode
each rank normalises with its own batch statistics (as PyTorch's DDP without SyncBatchNorm). Only
rank 0 writes files and prints.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping

from candle_nn import CandleNNError, WeightsFileError, save_safetensors
import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten
import numpy as np

from candle_nn.atomic_write import atomic_write
from candle_nn.checkpoint import write_safetensors
from candle_nn_models.classify_transforms import eval_transform, train_transform
from candle_nn_models.image_folder import ImageFolder, Split
from candle_nn_models.data_parallel import DataParallel
from candle_nn_models.divergence import check_finite_losses, check_finite_parameters
from candle_nn_models.image_loader import BatchLoader, labelled_images, stack_labelled
from candle_nn_models import train_checkpoint

CHECKPOINT = "checkpoint.safetensors"
BEST = "best.safetensors"
LABELS = "labels.txt"
RESULTS = "results.csv"
STATE_KEY = "candle_nn.train_state"
STATE_FIELDS = ("config", "epoch", "best_accuracy", "classes", "history", "run")  # see state()
OPTIMIZERS = ("sgd", "adamw")
DEFAULT_WEIGHT_DECAY = {"sgd": 1e-4, "adamw": 1e-2}  # torchvision's recipe, PyTorch's AdamW


@dataclass(frozen=True)
class TrainConfig:
    """What defines a run (saved in its checkpoint; a resumed run uses the saved one).

    ``batch_size`` is the global batch: the images of one optimizer step over all ranks.
    ``weight_decay=None``: 1e-4 for SGD, 1e-2 for AdamW. The learning rate follows MLX's
    ``cosine_decay`` from ``lr`` over all steps. SGD has momentum 0.9; AdamW is PyTorch's
    (``bias_correction=True``, betas 0.9/0.999, eps 1e-8).
    """

    epochs: int = 10
    batch_size: int = 32
    lr: float = 0.01
    optimizer: str = "sgd"
    weight_decay: float | None = None
    momentum: float = 0.9
    imgsz: int = 224
    seed: int = 0

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


@dataclass
class EpochResult:
    epoch: int  # 1-based
    train_loss: float
    train_accuracy: float
    val_loss: float
    val_accuracy: float
    lr: float
    seconds: float


def make_optimizer(config: TrainConfig, total_steps: int) -> optim.Optimizer:
    """The MLX optimizer of ``config`` with a cosine learning-rate decay over ``total_steps``."""
    schedule = optim.cosine_decay(config.lr, max(1, total_steps))
    decay = config.weight_decay
    if decay is None:
        decay = DEFAULT_WEIGHT_DECAY[config.optimizer]
    if config.optimizer == "sgd":
        return optim.SGD(schedule, momentum=config.momentum, weight_decay=decay)
    if config.optimizer == "adamw":
        return optim.AdamW(schedule, weight_decay=decay, bias_correction=True)
    raise CandleNNError(f"unknown optimizer {config.optimizer!r}; choose one of {OPTIMIZERS}")


class ClassifierTrainer:
    """Train ``model`` (NHWC images → logits) on ``data`` with ``config``.

    Args:
        model: its trainable parameters (``model.trainable_parameters()``) are what is learned;
            freeze layers (and BatchNorm statistics) before.
        data: the training and validation splits and the class names.
        out: the run folder (written by rank 0 only).
        best_metadata: safetensors metadata of ``best.safetensors``.
        group: the ``mx.distributed`` group (``None``: ``mx.distributed.init()``).
        workers: decoding threads; ``progress``: show a tqdm bar (rank 0).
        run_info: what else the checkpoint should record (a CLI's options, to resume with).
        frozen: ``(features, head)`` when only ``head`` learns (a frozen backbone): ``features``
            runs outside the gradient computation, which then spans the head alone (MLX
            differentiates only what it traces; the backbone's fast inference kernels stay on).
        log: where rank 0's per-epoch lines go.
    """

    def __init__(self, model: nn.Module, config: TrainConfig, data: ImageFolder, out: Path,
                 *, best_metadata: Mapping[str, str] | None = None,
                 group: "mx.distributed.Group | None" = None, workers: int = 4,
                 progress: bool = True, run_info: Mapping[str, Any] | None = None,
                 frozen: "tuple[Callable[[mx.array], mx.array], nn.Module] | None" = None,
                 log: Callable[[str], None] = print) -> None:
        self.model, self.config, self.data, self.out = model, config, data, Path(out)
        self.dp = DataParallel(group)
        self.rank, self.world = self.dp.rank, self.dp.world
        self.dp.check_batch(config.batch_size, "--batch-size")
        self.steps_per_epoch = len(data.train) // config.batch_size
        if self.steps_per_epoch == 0:
            raise CandleNNError(f"--batch-size {config.batch_size} is larger than the "
                                f"{len(data.train)} training images; pass a smaller one")
        self.optimizer = make_optimizer(config, config.epochs * self.steps_per_epoch)
        self.best_metadata = dict(best_metadata or {})
        self.workers, self.progress, self.log = max(1, workers), progress, log
        self.run_info = dict(run_info or {})
        self.epoch = 0  # finished epochs
        self.best_accuracy = -1.0
        self.history: list[EpochResult] = []
        self.features, self.learner = frozen if frozen is not None else (None, model)
        self._loss_and_grad = nn.value_and_grad(self.learner, self._loss)

    @property
    def is_main(self) -> bool:
        return self.dp.is_main

    # -- one step ----------------------------------------------------------------------------

    def _loss(self, model: nn.Module, x: mx.array, y: mx.array) -> tuple[mx.array, mx.array]:
        logits = model(x)
        return nn.losses.cross_entropy(logits, y, reduction="mean"), logits

    def step(self, x: mx.array, y: mx.array) -> tuple[mx.array, mx.array]:
        """One optimizer step on this rank's ``x`` ``(b, S, S, 3)``, ``y`` ``(b,)`` (the global
        batch's share); returns this rank's ``(loss, correct)``."""
        if self.features is not None:
            x = self.features(x)
        (loss, logits), grads = self._loss_and_grad(self.learner, x, y)
        grads = self.dp.average_gradients(grads)
        self.optimizer.update(self.learner, grads)
        correct = (mx.argmax(logits, axis=-1) == y).sum()
        mx.eval(loss, correct, self.model.parameters(), self.optimizer.state)
        return loss, correct

    # -- epochs ------------------------------------------------------------------------------

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's image indices of each training step of ``epoch`` (0-based): a seeded
        shuffle, cut into global batches (the last partial one dropped), each split over ranks."""
        c = self.config
        order = np.random.default_rng([c.seed, epoch]).permutation(len(self.data.train))
        return [self.dp.share(order[s * c.batch_size:(s + 1) * c.batch_size])
                for s in range(self.steps_per_epoch)]

    def train_epoch(self, epoch: int, pool: ThreadPoolExecutor) -> tuple[float, float]:
        """One epoch of steps; returns the mean training ``(loss, accuracy)`` over all ranks."""
        from tqdm import tqdm

        c, split = self.config, self.data.train

        def transform(rgb: np.ndarray, index: int) -> np.ndarray:
            return train_transform(rgb, np.random.default_rng([c.seed, epoch, index]), c.imgsz)

        loader = BatchLoader(self.batches(epoch), labelled_images(split.paths, split.labels,
                                                                  transform),
                             stack_labelled, pool)
        mx.random.seed(int(np.random.default_rng([c.seed, epoch]).integers(2 ** 63)))
        self.model.train()
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{c.epochs}", unit="batch", leave=True,
                   disable=not (self.progress and self.is_main), dynamic_ncols=True)
        totals = np.zeros(3)  # loss * images, correct, images
        for x, y in bar:
            loss, correct = self.step(mx.array(x), mx.array(y))
            check_finite_losses([float(loss)], epoch, "training", "--lr", c.lr)
            totals += self.dp.sum_values([float(loss) * len(y), float(correct), len(y)])
            bar.set_postfix(loss=f"{totals[0] / totals[2]:.4f}",
                            acc=f"{100 * totals[1] / totals[2]:.1f}%")
        bar.close()
        return totals[0] / totals[2], totals[1] / totals[2]

    def evaluate(self, split: Split, pool: ThreadPoolExecutor) -> tuple[float, float]:
        """Mean ``(loss, accuracy)`` on ``split`` (eval transform, eval mode), over all ranks."""
        c = self.config
        mine = self.dp.share(np.arange(len(split)))
        batches = [mine[i:i + c.batch_size] for i in range(0, len(mine), c.batch_size)]
        loader = BatchLoader(batches, labelled_images(split.paths, split.labels,
                                                      lambda rgb, _: eval_transform(rgb, c.imgsz)),
                             stack_labelled, pool)
        self.model.eval()
        totals = np.zeros(3)
        for x, y in loader:
            logits = self.model(mx.array(x))
            labels = mx.array(y)
            loss = nn.losses.cross_entropy(logits, labels, reduction="sum")
            correct = (mx.argmax(logits, axis=-1) == labels).sum()
            totals += [float(loss), float(correct), len(y)]
        totals = self.dp.sum_values(list(totals))
        return float(totals[0] / max(totals[2], 1)), float(totals[1] / max(totals[2], 1))

    def fit(self) -> list[EpochResult]:
        """Train from the current epoch to ``config.epochs``; returns the history."""
        with ThreadPoolExecutor(self.workers, thread_name_prefix="candle-nn-data") as pool:
            for epoch in range(self.epoch, self.config.epochs):
                start = time.perf_counter()
                train_loss, train_acc = self.train_epoch(epoch, pool)
                val_loss, val_acc = self.evaluate(self.data.val, pool)
                # nothing of a diverged epoch is written: the folder keeps the last good one
                check_finite_losses([val_loss], epoch, "validation", "--lr", self.config.lr)
                check_finite_parameters([self.model.parameters()], epoch, "--lr",
                                        self.config.lr)
                lr = float(self.optimizer.learning_rate)
                result = EpochResult(epoch + 1, float(train_loss), float(train_acc), val_loss,
                                     val_acc, lr, time.perf_counter() - start)
                self.history.append(result)
                self.epoch = epoch + 1
                improved = val_acc > self.best_accuracy
                if improved:
                    self.best_accuracy = val_acc
                if self.is_main:
                    if epoch == 0:  # with the first weights: a run that never ran leaves none
                        self._write_text(LABELS, "".join(f"{n}\n" for n in self.data.classes))
                    if improved:
                        save_safetensors(self.model, self.out / BEST, self.best_metadata)
                    self.save_checkpoint()
                    self._write_results()
                    self.log(f"epoch {result.epoch}/{self.config.epochs}: train loss "
                             f"{result.train_loss:.4f} acc {100 * result.train_accuracy:.1f}% | "
                             f"val loss {val_loss:.4f} acc {100 * val_acc:.1f}%"
                             f"{' (best)' if improved else ''} | {result.seconds:.1f} s")
        return self.history

    # -- files -------------------------------------------------------------------------------

    def _write_text(self, name: str, text: str) -> None:
        path = self.out / name
        try:
            with atomic_write(path) as tmp:
                tmp.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise CandleNNError(f"cannot write {path}: {exc.strerror or exc}") from exc

    def _write_results(self) -> None:
        buf = io.StringIO()
        names = [f.name for f in fields(EpochResult)]
        writer = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
        writer.writeheader()
        for row in self.history:
            writer.writerow(asdict(row))
        self._write_text(RESULTS, buf.getvalue())

    def state(self) -> tuple[dict[str, mx.array], dict[str, str]]:
        """The checkpoint's tensors and metadata."""
        tensors = {f"model.{k}": v for k, v in tree_flatten(self.model.parameters())}
        tensors.update({f"optimizer.{k}": v for k, v in tree_flatten(self.optimizer.state)})
        meta = {"config": asdict(self.config), "epoch": self.epoch,
                "best_accuracy": self.best_accuracy, "classes": self.data.classes,
                "history": [asdict(r) for r in self.history], "format": 1,
                "run": self.run_info}
        return tensors, {STATE_KEY: json.dumps(meta)}

    def save_checkpoint(self) -> None:
        tensors, meta = self.state()
        write_safetensors(self.out / CHECKPOINT, tensors, meta)

    def resume(self, path: "str | os.PathLike | None" = None) -> None:
        """Restore the model, optimizer, epoch and history from a checkpoint
        (default: the run folder's)."""
        path = Path(path) if path is not None else self.out / CHECKPOINT
        tensors, meta = read_checkpoint(path)
        if meta["classes"] != self.data.classes:
            raise CandleNNError(f"{path} was trained on classes {meta['classes']}, but the data "
                                f"folder now has {self.data.classes}")
        model = [(k[len("model."):], v) for k, v in tensors.items() if k.startswith("model.")]
        ours = dict(tree_flatten(self.model.parameters()))
        if set(k for k, _ in model) != set(ours):
            raise WeightsFileError(f"{path} holds another model's parameters than this one's")
        self.model.update(tree_unflatten(model))
        opt = [(k[len("optimizer."):], v) for k, v in tensors.items()
               if k.startswith("optimizer.")]
        self.optimizer.state = tree_unflatten(opt)
        mx.eval(self.model.parameters(), self.optimizer.state)
        self.epoch = int(meta["epoch"])
        self.best_accuracy = float(meta["best_accuracy"])
        self.history = [EpochResult(**r) for r in meta["history"]]


def read_checkpoint(path: "str | os.PathLike") -> tuple[dict[str, mx.array], dict[str, Any]]:
    """A training checkpoint's tensors and its state (config, epoch, classes, history)."""
    tensors, meta = train_checkpoint.read_checkpoint(path, STATE_KEY, "candle-resnet training",
                                                     STATE_FIELDS)
    if not isinstance(meta["config"], dict) or "epochs" not in meta["config"]:
        raise WeightsFileError(f"{path} is not a candle-resnet training checkpoint of this "
                               "version (its config lacks epochs); start the run again without "
                               "--resume, into another --out")
    return tensors, meta

