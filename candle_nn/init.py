"""Seeded parameter initialisers.

An :class:`Init` describes a distribution; :meth:`Init.sample` draws a tensor from it with an MLX
PRNG key. :func:`variable_key` derives the key of one variable from ``(seed, full variable path)``,
so every variable has its own random stream: the same seed gives the same values on every run and
on every device (sampling always runs on the CPU stream, then the result is cast and handed to the
target device), and two variables never share values.

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


@dataclass(frozen=True)
class Init:
    """A parameter distribution. Build with the static constructors, draw with :meth:`sample`."""

    kind: str
    a: float = 0.0
    b: float = 0.0
    fan: Fan = "in"
    nonlinearity: str = "relu"

    @staticmethod
    def const(value: float) -> "Init":
        """Every element equals ``value``."""
        return Init("const", a=float(value))

    @staticmethod
    def normal(mean: float = 0.0, std: float = 1.0) -> "Init":
        """Normal(mean, std)."""
        return Init("normal", a=float(mean), b=float(std))

    @staticmethod
    def uniform(lo: float = -1.0, hi: float = 1.0) -> "Init":
        """Uniform on [lo, hi)."""
        return Init("uniform", a=float(lo), b=float(hi))

    @staticmethod
    def kaiming_normal(fan: Fan = "in", nonlinearity: str = "relu") -> "Init":
        """Normal(0, gain / sqrt(fan)) (He et al. 2015)."""
        return Init("kaiming_normal", fan=fan, nonlinearity=nonlinearity)

    @staticmethod
    def kaiming_uniform(fan: Fan = "in", nonlinearity: str = "relu") -> "Init":
        """Uniform(-b, b) with b = gain * sqrt(3 / fan)."""
        return Init("kaiming_uniform", fan=fan, nonlinearity=nonlinearity)

    def std_or_bound(self, shape: Sequence[int]) -> float:
        """Kaiming std (normal) or bound (uniform) for ``shape``."""
        fan_in, fan_out = fans(shape)
        fan = fan_in if self.fan == "in" else fan_out
        std = calculate_gain(self.nonlinearity) / math.sqrt(max(fan, 1))
        return std if self.kind == "kaiming_normal" else std * math.sqrt(3.0)

    def sample(self, shape: Sequence[int], key: mx.array, dtype: mx.Dtype = mx.float32) -> mx.array:
        """Draw a tensor of ``shape``; computed in float32 on the CPU stream, then cast."""
        shape = tuple(int(s) for s in shape)
        with mx.stream(mx.cpu):
            if self.kind == "const":
                out = mx.full(shape, self.a, dtype=mx.float32)
            elif self.kind == "normal":
                out = mx.random.normal(shape, key=key) * self.b + self.a
            elif self.kind == "uniform":
                out = mx.random.uniform(self.a, self.b, shape, key=key)
            elif self.kind == "kaiming_normal":
                out = mx.random.normal(shape, key=key) * self.std_or_bound(shape)
            elif self.kind == "kaiming_uniform":
                bound = self.std_or_bound(shape)
                out = mx.random.uniform(-bound, bound, shape, key=key)
            else:
                raise ValueError(f"unknown init kind {self.kind!r}")
            out = out.astype(dtype)
            mx.eval(out)
        return out


ZEROS = Init.const(0.0)
ONES = Init.const(1.0)
DEFAULT_KAIMING_NORMAL = Init.kaiming_normal("in", "relu")
DEFAULT_KAIMING_UNIFORM = Init.kaiming_uniform("in", "relu")
