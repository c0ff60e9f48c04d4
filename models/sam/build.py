"""A SAM model from a weights file, as the SAM task API and every SAM program load it: MobileSAM
(TinyViT) or SAM's ViT encoders, the encoder read from the file unless asked for, candle's
published file by default."""

from __future__ import annotations

import os
from pathlib import Path

from candle_nn import Device, VarBuilder

from candle_nn_models.segment_anything import Sam, infer_encoder

from candle_nn_models.weights.registry import resolve_weights
from candle_nn_models.weights.spec import SPECS, build_model

__all__ = ["FAMILIES", "MODELS", "load_sam"]

# the encoders: MobileSAM's, then SAM's (the registry's variants: tiny, vit_b, vit_l, vit_h)
FAMILIES = ("mobile_sam", "sam")
MODELS = tuple(variant for family in FAMILIES for variant in SPECS[family].variants)


def load_sam(variant: "str | None", weights: "str | os.PathLike | None",
             device: Device) -> tuple[Sam, Path, str]:
    """SAM with the ``variant`` encoder (one of :data:`MODELS`; ``None``: what ``weights`` holds,
    else MobileSAM's) from ``weights`` (default: the published file), built through the
    registry; the weights file and the encoder."""
    if variant is None and weights is not None:
        path = resolve_weights(FAMILIES[0], MODELS[0], weights)
        vb = VarBuilder.from_safetensors(path, device=device)
        variant = infer_encoder(vb, name=str(path))
    else:
        variant = variant or MODELS[0]
        path = resolve_weights(_family(variant), variant, weights)
        vb = VarBuilder.from_safetensors(path, device=device)
    return build_model(_family(variant), variant, vb), path, variant


def _family(variant: str) -> str:
    return next(f for f in FAMILIES if variant in SPECS[f].variants)
