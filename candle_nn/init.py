"""Seeded parameter initialisers.

An :class:`Init` describes a distribution (:class:`Const`, :class:`Normal`, :class:`Uniform`,
:class:`Kaiming`, built with ``Init``'s named constructors); :meth:`Init.sample` draws a tensor
from it with an MLX PRNG key. :func:`variable_key` derives the key of one variable from
``(seed, full variable path)``, so every variable has its own random stream: the same seed gives
the same values on every run and on every device (sampling always runs on the CPU stream, then the
result is cast and handed to the target device), and two variables never share values.

Fan computations assume candle/PyTorch layouts, which is what VarBuilders store:
linear ``(out, in)``, conv ``(out, in/groups, kH, kW)``: fan_in = shape[1] * prod(shape[2:]),
fan_out = shape[0] * prod(shape[2:]).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Literal, Sequence

import mlx.core as mx

Fan = Literal["in", "out"]


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """Recommended gain for a nonlinearity, as ``torch.nn.init.calculate_gain``."""
    linear_like = {"linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                   "conv_transpose2d", "conv_transpose3d", "sigmoid", "identity"}
    if nonlinearity in linear_like:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3.0
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1.0 + slope**2))
    if nonlinearity == "selu":
        return 0.75
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r}")


def fans(shape: Sequence[int]) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight in candle/PyTorch layout."""
    if len(shape) < 2:
        n = int(shape[0]) if shape else 1
        return n, n
    receptive = math.prod(shape[2:]) if len(shape) > 2 else 1
    return int(shape[1]) * receptive, int(shape[0]) * receptive


def variable_key(seed: int, path: str) -> mx.array:
    """The PRNG key of variable ``path`` under ``seed`` (stable across runs and machines)."""
    digest = hashlib.sha256(f"{int(seed)}\x00{path}".encode()).digest()
    return mx.random.key(int.from_bytes(digest[:8], "little"))


class Init:
    """A parameter distribution, as candle's ``Init`` enum: build one with the named constructors
    (:meth:`const`, :meth:`normal`, :meth:`uniform`, :meth:`kaiming_normal`,
    :meth:`kaiming_uniform`), which return the dataclasses below with their named fields; draw
    with :meth:`sample`."""

    @staticmethod
    def const(value: float) -> "Const":
        """Every element equals ``value``."""
        return Const(float(value))

    @staticmethod
    def normal(mean: float = 0.0, std: float = 1.0) -> "Normal":
        """Normal(mean, std)."""
        return Normal(float(mean), float(std))

    @staticmethod
    def uniform(lo: float = -1.0, hi: float = 1.0) -> "Uniform":
        """Uniform on [lo, hi)."""
        return Uniform(float(lo), float(hi))

    @staticmethod
    def kaiming_normal(fan: Fan = "in", nonlinearity: str = "relu") -> "Kaiming":
        """Normal(0, gain / sqrt(fan)) (He et al. 2015)."""
        return Kaiming("normal", fan, nonlinearity)

    @staticmethod
    def kaiming_uniform(fan: Fan = "in", nonlinearity: str = "relu") -> "Kaiming":
        """Uniform(-b, b) with b = gain * sqrt(3 / fan)."""
        return Kaiming("uniform", fan, nonlinearity)

    def sample(self, shape: Sequence[int], key: mx.array, dtype: mx.Dtype = mx.float32) -> mx.array:
        """Draw a tensor of ``shape``; computed in float32 on the CPU stream, then cast."""
        shape = tuple(int(s) for s in shape)
        with mx.stream(mx.cpu):
            out = self._draw(shape, key).astype(dtype)
            mx.eval(out)
        return out

    def _draw(self, shape: tuple[int, ...], key: mx.array) -> mx.array:
        """A float32 tensor of ``shape`` (runs on the CPU stream)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Const(Init):
    value: float

    def _draw(self, shape: tuple[int, ...], key: mx.array) -> mx.array:
        return mx.full(shape, self.value, dtype=mx.float32)


@dataclass(frozen=True)
class Normal(Init):
    mean: float
    std: float

    def _draw(self, shape: tuple[int, ...], key: mx.array) -> mx.array:
        return mx.random.normal(shape, key=key) * self.std + self.mean


@dataclass(frozen=True)
class Uniform(Init):
    lo: float
    hi: float

    def _draw(self, shape: tuple[int, ...], key: mx.array) -> mx.array:
        return mx.random.uniform(self.lo, self.hi, shape, key=key)


@dataclass(frozen=True)
class Kaiming(Init):
    """He et al. 2015: std ``gain(nonlinearity) / sqrt(fan)``; the uniform bound is
    ``std * sqrt(3)``."""

    distribution: Literal["normal", "uniform"]
    fan: Fan = "in"
    nonlinearity: str = "relu"

    def std(self, shape: Sequence[int]) -> float:
        """The standard deviation for a weight of ``shape`` (candle/PyTorch layout)."""
        fan_in, fan_out = fans(shape)
        fan = fan_in if self.fan == "in" else fan_out
        return calculate_gain(self.nonlinearity) / math.sqrt(max(fan, 1))

    def _draw(self, shape: tuple[int, ...], key: mx.array) -> mx.array:
        if self.distribution == "normal":
            return mx.random.normal(shape, key=key) * self.std(shape)
        bound = self.std(shape) * math.sqrt(3.0)
        return mx.random.uniform(-bound, bound, shape, key=key)


ZEROS = Init.const(0.0)
ONES = Init.const(1.0)
DEFAULT_KAIMING_NORMAL = Init.kaiming_normal("in", "relu")
DEFAULT_KAIMING_UNIFORM = Init.kaiming_uniform("in", "relu")
