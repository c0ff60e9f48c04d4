"""Batch normalisation over the channel (last) axis of NHWC tensors, for inference and training."""

from __future__ import annotations

import math
from typing import Callable

import mlx.core as mx
import mlx.nn as nn

from . import ops
from .checkpoint import BN_EPS_KEY as EPS_KEY, BN_MOMENTUM_KEY as MOMENTUM_KEY
from .device import Device
from .errors import ConfigError, WeightsFileError
from .init import ONES, ZEROS
from .inputs import check_layer_input
from .module import Module
from .var_builder import VarBuilder


def batch_norm_settings(vb: VarBuilder, eps: float, momentum: float) -> tuple[float, float]:
    """``(eps, momentum)`` as the weights behind ``vb`` record them (metadata
    ``candle_nn.bn_eps``, ``candle_nn.bn_momentum``: a file's own settings, its source model's,
    win over a model's defaults — ultralytics' detectors use eps 1e-3, its classifiers PyTorch's
    1e-5, on the same blocks), else the given defaults. WeightsFileError for a
    recorded value that is not a number in (0, 1)."""
    meta = vb.metadata
    return _setting(meta, EPS_KEY, eps), _setting(meta, MOMENTUM_KEY, momentum)


def _setting(meta: dict[str, str], key: str, default: float) -> float:
    if key not in meta:
        return float(default)
    try:
        value = float(meta[key])
    except ValueError:
        value = math.nan
    if not 0.0 < value < 1.0:
        raise WeightsFileError(
            f"the weights' metadata {key} = {meta[key][:40]!r} is not a number in (0, 1); "
            "re-convert the checkpoint with candle-nn-weights convert")
    return value



class BatchNorm2d(Module):
    """PyTorch's ``BatchNorm2d`` on channels-last tensors.

    Args:
        running_mean, running_var, weight, bias: ``(C,)`` each.
        eps: added to the variance (PyTorch's default 1e-5; YOLOv8 uses 1e-3).
        momentum: weight of the batch statistic in the running-statistics update (PyTorch's
            convention: torchvision 0.1, ultralytics 0.03).

    Input ``(N, H, W, C)`` (or any ``(..., C)``) → same shape.

    * ``eval()`` (how it is built, and how models' ``load`` return it):
      ``(x - running_mean) / sqrt(running_var + eps) * weight + bias``.
    * ``train()``: normalised by the batch's mean and biased variance over every axis but the
      last; the running statistics become ``(1 - momentum) * running + momentum * batch``, the
      variance's batch term unbiased (``n / (n - 1)``), exactly as PyTorch. Under
      ``nn.value_and_grad`` the update is stored on the module; under ``mx.compile`` pass
      ``model.state`` as the compiled function's inputs and outputs (as for ``mlx.nn.BatchNorm``).
    * :meth:`freeze_stats` (or :func:`freeze_bn_stats` on a whole model): running statistics
      in train mode too, never updated; ``weight`` and ``bias`` still learn.

    ``running_mean`` / ``running_var`` are frozen parameters (not trainable: not in
    ``trainable_parameters()``, never given a gradient), as in ``mlx.nn.BatchNorm``; they stay
    frozen through ``unfreeze()``. Fold it into the preceding convolution for inference with
    :meth:`Conv2d.absorb_bn`.
    """

    _always_frozen = ("running_mean", "running_var")

    def __init__(self, running_mean: mx.array, running_var: mx.array, weight: mx.array,
                 bias: mx.array, eps: float = 1e-5, *, momentum: float = 0.1,
                 device: Device) -> None:
        super().__init__(device)
        _check_hyper("eps", eps, "a small positive number such as 1e-5",
                     lambda v: 0 <= v < math.inf)
        _check_hyper("momentum", momentum, "in [0, 1], PyTorch's (0.1 by default)",
                     lambda v: 0 <= v <= 1)
        self.running_mean = running_mean
        self.running_var = running_var
        self.weight = weight
        self.bias = bias
        self.eps = float(eps)
        self.momentum = float(momentum)
        object.__setattr__(self, "_stats_frozen", False)
        self.freeze(keys=list(self._always_frozen), recurse=False)
        self.eval()

    @classmethod
    def load(cls, vb: VarBuilder, num_features: int, eps: float = 1e-5,
             momentum: float = 0.1) -> "BatchNorm2d":
        """Read ``running_mean``, ``running_var``, ``weight``, ``bias`` (each ``(C,)``);
        ``eps`` and ``momentum`` are the defaults for a file that does not record its own
        (:func:`batch_norm_settings`)."""
        eps, momentum = batch_norm_settings(vb, eps, momentum)
        shape = (num_features,)
        return cls(vb.get(shape, "running_mean", ZEROS), vb.get(shape, "running_var", ONES),
                   vb.get(shape, "weight", ONES), vb.get(shape, "bias", ZEROS), eps,
                   momentum=momentum, device=vb.device).loaded_from(vb)

    def freeze_stats(self, frozen: bool = True) -> "BatchNorm2d":
        """Use (and keep) the running statistics in train mode too (``frozen``), or go back to
        batch statistics in train mode; returns self."""
        object.__setattr__(self, "_stats_frozen", bool(frozen))
        return self

    @property
    def stats_frozen(self) -> bool:
        return self._stats_frozen

    def candle_tensors(self, prefix: str) -> dict[str, mx.array]:
        """``running_mean``, ``running_var``, ``weight``, ``bias`` ``(C,)`` under ``prefix``."""
        names = ("running_mean", "running_var", "weight", "bias")
        return {f"{prefix}.{k}": self[k] for k in names}

    def scale_shift(self) -> tuple[mx.array, mx.array]:
        """Per-channel ``(scale, shift)`` with ``bn(x) == x * scale + shift`` in eval mode,
        computed in float32."""
        var = self.running_var.astype(mx.float32)
        scale = self.weight.astype(mx.float32) * mx.rsqrt(var + self.eps)
        shift = self.bias.astype(mx.float32) - self.running_mean.astype(mx.float32) * scale
        return scale, shift

    def forward(self, x: mx.array) -> mx.array:
        check_layer_input(x, "BatchNorm2d", spatial=True, channels=self.weight.shape[0])
        if not self.training or self._stats_frozen:
            scale, shift = self.scale_shift()
            return x * scale.astype(x.dtype) + shift.astype(x.dtype)
        count = x.size // x.shape[-1]
        if count < 2:
            raise ValueError(f"BatchNorm2d in train mode needs more than one value per channel, "
                             f"got input {x.shape}; call model.eval() for single values")
        xf = x.astype(mx.float32)
        mean = ops.channel_mean(xf)
        var = ops.channel_mean(mx.square(xf - mean))
        y = ops.batch_norm_train(xf, mean, var, self.weight, self.bias, self.eps)
        m = self.momentum
        stats_dtype = self.running_mean.dtype
        batch_mean = mx.stop_gradient(mean)
        batch_var = mx.stop_gradient(var * (count / (count - 1)))  # unbiased, as PyTorch
        self.running_mean = ((1 - m) * self.running_mean + m * batch_mean).astype(stats_dtype)
        self.running_var = ((1 - m) * self.running_var + m * batch_var).astype(stats_dtype)
        return y.astype(x.dtype)


def _check_hyper(name: str, value: float, want: str, ok: Callable[[float], bool]) -> None:
    try:
        good = ok(float(value))  # NaN fails every comparison
    except (TypeError, ValueError):
        good = False
    if not good:
        raise ConfigError(f"BatchNorm2d: {name}={value!r} is not a valid {name}: pass "
                                 f"{want}")


def freeze_bn_stats(model: nn.Module, frozen: bool = True) -> nn.Module:
    """:meth:`BatchNorm2d.freeze_stats` on every BatchNorm2d in ``model`` (PyTorch's recipe of
    ``bn.eval()`` inside a training model, kept through ``model.train()``); returns ``model``."""
    for _, module in model.named_modules():
        if isinstance(module, BatchNorm2d):
            module.freeze_stats(frozen)
    return model
