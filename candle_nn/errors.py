"""Exceptions raised by candle_nn.

Every error the library raises on purpose derives from :class:`CandleNNError`, so a caller (or a
CLI) can catch one type and print one clear line. Messages say what went wrong, where, and how to
fix it.
"""

from __future__ import annotations


class CandleNNError(Exception):
    """Base class of every error raised by candle_nn on purpose."""


class DeviceUnavailableError(CandleNNError):
    """A device was requested that this machine / MLX build does not have."""


class DeviceMismatchError(CandleNNError):
    """Modules, tensors or VarBuilders of two different devices were combined."""


class ModuleInitError(CandleNNError, AttributeError):
    """A Module subclass used without ``Module.__init__`` having run (``super().__init__``)."""


class ConfigError(CandleNNError, ValueError):
    """A layer or model was built with a setting it cannot take (a NaN BatchNorm momentum)."""


class OutOfRangeError(CandleNNError, IndexError):
    """An index outside what it indexes (an embedding id past its table)."""


class MissingTensorError(CandleNNError, KeyError):
    """A VarBuilder was asked for a tensor that its source does not hold."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class ShapeMismatchError(CandleNNError, ValueError):
    """A tensor exists but its shape is not the one the model expects."""


class DTypeError(CandleNNError, TypeError):
    """A tensor or request has a dtype that cannot be used where it was given."""


class WeightsFileError(CandleNNError):
    """A weights file is missing, unreadable, truncated or malformed."""


class ImageError(CandleNNError):
    """An image file is missing, unreadable or not an image."""
