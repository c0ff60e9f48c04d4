"""Segment Anything (MobileSAM: TinyViT-5M encoder) on candle_nn, with candle's tensor names.

``Sam.load(vb)`` (or ``Sam.load(vb, "vit_b")`` for the original SAM) builds the model
from a VarBuilder over a checkpoint with ``image_encoder.*`` / ``prompt_encoder.*`` /
``mask_decoder.*`` tensors; ``SamPredictor(sam)`` embeds an image once and answers point / box /
mask prompts; ``SamAutomaticMaskGenerator(sam)`` segments a whole image from a grid of points.
Everything is NHWC.
"""

from .automatic_mask_generator import SamAutomaticMaskGenerator
from .image_encoder import VIT_CONFIGS, ImageEncoderViT, ViTConfig
from .mask_decoder import MaskDecoder
from .neck import Neck
from .predictor import SamPredictor
from .prompt_encoder import PositionEmbeddingRandom, PromptEncoder
from .sam import IMAGE_SIZE, MOBILE_SAM_ENCODERS, PIXEL_MEAN, PIXEL_STD, Sam, infer_encoder
from .tiny_vit import TINY_VIT_CONFIGS, TinyViT, TinyViTConfig
from .transformer import TwoWayTransformer
from .transforms import ResizeLongestSide

__all__ = [
    "IMAGE_SIZE", "ImageEncoderViT", "MOBILE_SAM_ENCODERS", "MaskDecoder", "Neck", "PIXEL_MEAN",
    "PIXEL_STD", "PositionEmbeddingRandom", "PromptEncoder", "ResizeLongestSide", "Sam",
    "SamAutomaticMaskGenerator", "SamPredictor",
    "TINY_VIT_CONFIGS", "TinyViT", "TinyViTConfig", "TwoWayTransformer", "VIT_CONFIGS", "ViTConfig",
    "infer_encoder",
]
