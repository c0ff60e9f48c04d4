"""ultralytics models built from their YAML with seeded weights (never downloaded), as the YOLO
parity tests' references, and the float32 tolerance rule of ``../shared/fixtures/README.md``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from helpers.ultralytics_reference import import_ultralytics


def seeded(kind: str, yaml: str, seed: int = 0, **kwargs):
    """``ultralytics.nn.tasks.<kind>(yaml)`` in eval mode, seeded, with non-trivial BatchNorm
    statistics (so folding is exercised) and, for detection heads, class biases that give
    confident detections on a real image."""
    import_ultralytics()
    from ultralytics.nn import tasks

    torch.manual_seed(seed)
    model = getattr(tasks, kind)(yaml, verbose=False, **kwargs).eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    head = model.model[-1]
    if hasattr(head, "cv3"):
        with torch.no_grad():
            for branch in head.cv3:
                branch[-1].bias.uniform_(-4.0, 0.0)
    return model


def tolerance(f32: np.ndarray, f64: np.ndarray) -> float:
    """The fixtures' float32 rule for an output the reference computed as ``f32`` in float32 and
    ``f64`` in float64: 10× its own error ``max|f32 - f64| / max|f64|``, floored at 1e-4."""
    return max(1e-4, 10 * float(np.abs(f32 - f64).max() / np.abs(f64).max()))


def convert_and_save(model, path: Path) -> Path:
    """The model's state_dict through ``convert_ultralytics`` into a safetensors file."""
    from candle_nn_models.weights.convert import convert_ultralytics, save

    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return save(convert_ultralytics(state, source="seeded"), path)
