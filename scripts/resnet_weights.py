"""A ResNet weights file as the ResNet commands open it (``candle-resnet`` and its ``train``): the
published checkpoint of the variant by default, the file's variant checked against the one asked
for."""

from __future__ import annotations

from pathlib import Path

from candle_nn import CandleNNError, Device, VarBuilder

from candle_nn_models.resnet import infer_variant
from candle_nn_models.weights.registry import resolve_weights


def open_resnet_weights(weights: str | None, variant: str | None, device: Device,
                        ) -> tuple[VarBuilder, str, int | None, Path]:
    """``(vb, variant, num_classes, path)`` of ``weights`` (default: the published ``variant``,
    resnet18 without one); ``num_classes`` is ``None`` for a headless file. Raises CandleNNError
    when the file holds another variant than ``variant``."""
    path = resolve_weights("resnet", variant or "resnet18", weights)
    vb = VarBuilder.from_safetensors(path, device=device)
    found, num_classes = infer_variant(vb, name=str(path))
    if variant is not None and variant != found:
        raise CandleNNError(f"{path} holds {found} weights, not {variant}: drop --variant to use "
                            f"them, or pass {variant} weights with --weights")
    return vb, found, num_classes, path
