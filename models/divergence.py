"""Stopping a training that diverged: a loss or a weight that is no longer a finite number (a
learning rate too high, say) is one :class:`TrainingDivergedError` naming the learning-rate
option, raised before the epoch's files are written (the run folder keeps the last good epoch)."""

from __future__ import annotations

import math
from typing import Any, Iterable

from candle_nn import CandleNNError
import mlx.core as mx
from mlx.utils import tree_flatten

__all__ = ["TrainingDivergedError", "check_finite_losses", "check_finite_parameters"]


class TrainingDivergedError(CandleNNError):
    """The loss or the weights of a training are not finite any more."""


def _diverged(epoch: int, what: str, lr_option: str, lr: float) -> TrainingDivergedError:
    return TrainingDivergedError(
        f"training diverged in epoch {epoch + 1}: {what}; start again with a lower {lr_option} "
        f"(this run's is {lr:g}); the run folder keeps its last finished epoch, if any")


def check_finite_losses(values: Iterable[float], epoch: int, where: str, lr_option: str,
                        lr: float) -> None:
    """Raise when any loss of ``values`` (host floats) is NaN or infinite."""
    values = [float(v) for v in values]
    if not all(math.isfinite(v) for v in values):
        shown = ", ".join(f"{v:g}" for v in values)
        raise _diverged(epoch, f"the {where} loss is {shown}", lr_option, lr)


def check_finite_parameters(trees: Iterable[Any], epoch: int, lr_option: str,
                            lr: float) -> None:
    """Raise when any array of the parameter ``trees`` holds a NaN or an infinity (one scalar
    read back: a reduction per array on the device)."""
    flags = [mx.isfinite(v).all() for tree in trees for _, v in tree_flatten(tree)]
    if flags and not bool(mx.stack(flags).all()):
        raise _diverged(epoch, "its weights are no longer finite numbers", lr_option, lr)
