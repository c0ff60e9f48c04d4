"""The SAM task API (MobileSAM, SAM ViT-B/L/H), as ``candle-segment-anything`` runs it::

    from candle_nn_models import sam
    model = sam.load("mobile_sam.safetensors", device="cpu")  # no path: candle's MobileSAM
    r = model.predict("bike.jpg", points=[[580, 240]], labels=[1], multimask=True)
    r.masks, r.scores, r.best  # (C, H, W) bool, (C,) predicted IoUs, the best one's index
    r.to_json()  # the record `candle-segment-anything --json` prints
    model.everything("bike.jpg", points_per_side=16).to_json()  # `--everything --json`'s

The encoder runs once per image (``model.save_embedding`` keeps its output in a file);
``candle-segment-anything`` is a client of this package.
"""

from .build import MODELS, load_sam
from .model import SamImage, SamModel, check_sam_shape, load
from .options import KNOBS
from .prompts import PromptError, Prompts
from .result import EverythingResult, SamResult, mask_json

__all__ = ["EverythingResult", "KNOBS", "MODELS", "PromptError", "Prompts", "SamImage",
           "SamModel", "SamResult", "check_sam_shape", "load", "load_sam", "mask_json"]
