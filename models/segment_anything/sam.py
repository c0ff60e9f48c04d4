"""The Segment Anything model: image encoder + prompt encoder + mask decoder, with SAM's
pre- and postprocessing.

Everything is NHWC: images ``(B, H, W, 3)``, embeddings ``(B, 64, 64, 256)``, masks
``(B, H, W, M)`` with one channel per mask. For a numpy-in, numpy-out interface with prompts in
original-image pixels, use :class:`~candle_nn_models.segment_anything.predictor.SamPredictor`.
"""

from __future__ import annotations

import functools
import candle_nn as cn
from candle_nn import Module, VarBuilder
from candle_nn.upsample import bilinear_resize_matrix
import mlx.core as mx
import numpy as np

from .amg.point_decoder import PointGridDecoder
from .image_encoder import VIT_CONFIGS, ImageEncoderViT, ViTConfig
from .mask_decoder import MaskDecoder
from .prompt_encoder import PromptEncoder
from .tiny_vit import TINY_VIT_CONFIGS, TinyViT, TinyViTConfig

IMAGE_SIZE = 1024
PROMPT_EMBED_DIM = 256
IMAGE_EMBEDDING_SIZE = 64  # IMAGE_SIZE / 16
MASK_IN_CHANS = 16
PIXEL_MEAN = (123.675, 116.28, 103.53)
PIXEL_STD = (58.395, 57.12, 57.375)


# MobileSAM's encoder names (the "vit_t" of its checkpoints is our "tiny") -> TinyViT config.
MOBILE_SAM_ENCODERS = {"tiny": "5m"}


class Sam(Module):
    """SAM: an image encoder (``image_encoder.*``), the prompt encoder (``prompt_encoder.*``) and
    the mask decoder (``mask_decoder.*``).

    Build it with :meth:`load`: ``Sam.load(vb)`` is MobileSAM, ``Sam.load(vb, "vit_b")`` the
    original SAM. Calling the model decodes prompts against a precomputed image embedding (see
    :meth:`forward`); :meth:`embed` runs the encoder.
    """

    mask_threshold: float = 0.0
    image_size: int = IMAGE_SIZE

    def __init__(self, image_encoder: Module, prompt_encoder: PromptEncoder,
                 mask_decoder: MaskDecoder) -> None:
        super().__init__(prompt_encoder.device)
        self.image_encoder = image_encoder
        self.prompt_encoder = prompt_encoder
        self.mask_decoder = mask_decoder
        self._pixel_mean = mx.array(PIXEL_MEAN, dtype=mx.float32)
        self._pixel_std = mx.array(PIXEL_STD, dtype=mx.float32)

    @classmethod
    def load(cls, vb: VarBuilder,
             encoder: "str | TinyViTConfig | ViTConfig" = "tiny", *,
             fold_bn: bool = True) -> "Sam":
        """Build SAM from ``vb`` with the image encoder ``encoder``: ``"tiny"`` (MobileSAM's
        TinyViT-5M, candle's ``Sam::new_tiny``), ``"vit_b"`` (candle's ``Sam::new(768, 12, 12,
        &[2, 5, 8, 11])``), ``"vit_l"``, ``"vit_h"``, or a :class:`TinyViTConfig` /
        :class:`ViTConfig`. ``fold_bn=False`` keeps TinyViT's BatchNorms, to train (the ViT
        encoders have none)."""
        size = IMAGE_EMBEDDING_SIZE
        image_vb = vb.pp("image_encoder")
        if isinstance(encoder, str):
            _check_encoder(vb, encoder)
            encoder = (TINY_VIT_CONFIGS[MOBILE_SAM_ENCODERS[encoder]]
                       if encoder in MOBILE_SAM_ENCODERS else VIT_CONFIGS.get(encoder, encoder))
        if isinstance(encoder, TinyViTConfig):
            image_encoder: Module = TinyViT.load(image_vb, encoder, fold_bn=fold_bn)
        elif isinstance(encoder, ViTConfig):
            image_encoder = ImageEncoderViT.load(image_vb, encoder)
        else:
            raise ValueError(f"unknown SAM encoder {encoder!r}; choose one of "
                             f"{[*MOBILE_SAM_ENCODERS, *VIT_CONFIGS]}")
        sam = cls(image_encoder,
                  PromptEncoder.load(vb.pp("prompt_encoder"), PROMPT_EMBED_DIM, (size, size),
                                     (IMAGE_SIZE, IMAGE_SIZE), MASK_IN_CHANS),
                  MaskDecoder.load(vb.pp("mask_decoder"), PROMPT_EMBED_DIM,
                                   num_multimask_outputs=3, iou_head_depth=3,
                                   iou_head_hidden_dim=256))
        vb.check_all_read("SAM", unused=("image_encoder.*",))  # the encoder checked its own
        return sam

    # -- image side ------------------------------------------------------------------------------
    def preprocess(self, pixels: mx.array) -> mx.array:
        """Normalise ``(B, h, w, 3)`` RGB values in 0..255 and zero-pad bottom/right to 1024².

        ``h, w <= 1024`` (resize first, e.g. with ``ResizeLongestSide``). → ``(B, 1024, 1024, 3)``
        in the model's dtype (normalised in float32).
        """
        _, h, w, _ = pixels.shape
        if h > IMAGE_SIZE or w > IMAGE_SIZE:
            raise cn.ImageError(f"image of {w}x{h} is larger than {IMAGE_SIZE}x{IMAGE_SIZE}: "
                                "resize it first (ResizeLongestSide)")
        with self.on_device():
            x = (pixels.astype(mx.float32) - self._pixel_mean) / self._pixel_std
            x = mx.pad(x, [(0, 0), (0, IMAGE_SIZE - h), (0, IMAGE_SIZE - w), (0, 0)])
            return x.astype(cn.model_dtype(self.image_encoder) or mx.float32)

    def embed(self, image: mx.array) -> mx.array:
        """Image embeddings ``(B, 64, 64, 256)`` of a preprocessed ``(B, 1024, 1024, 3)`` batch."""
        cn.check_image_batch(image, model="Sam.embed", dtype=cn.model_dtype(self.image_encoder),
                             preprocessing="Sam.preprocess(pixels) (or SamPredictor.set_image)")
        return self.image_encoder(image)

    def get_dense_pe(self) -> mx.array:
        """Positional encoding of the embedding grid ``(1, 64, 64, 256)``."""
        return self.prompt_encoder.get_dense_pe()

    # -- prompt side -----------------------------------------------------------------------------
    def forward(self, image_embeddings: mx.array,
                points: tuple[mx.array, mx.array] | None = None,
                boxes: mx.array | None = None, masks: mx.array | None = None,
                multimask_output: bool = True) -> tuple[mx.array, mx.array]:
        """Low-res mask logits ``(B, 256, 256, M)`` and IoU predictions ``(B, M)``.

        Args:
            image_embeddings: ``(1, 64, 64, 256)`` from :meth:`embed`.
            points: ``(coords (B, N, 2), labels (B, N))``; coords ``(x, y)`` in pixels of the
                1024 input frame, labels 1 (foreground) / 0 (background).
            boxes: ``(B, 4)`` ``x1, y1, x2, y2`` in the input frame.
            masks: ``(B, 256, 256, 1)`` low-res logits from an earlier prediction.
            multimask_output: three masks (M = 3) or one (M = 1).
        """
        sparse, dense = self.prompt_encoder(points, boxes, masks)
        return self.mask_decoder(image_embeddings, self.prompt_encoder.get_dense_pe(), sparse,
                                 dense, multimask_output)

    def point_grid_decoder(self, image_embeddings: mx.array) -> PointGridDecoder:
        """:meth:`forward` for many single foreground-point prompts against one ``(1, 64, 64,
        256)`` embedding (automatic mask generation's prompts), with the image's share of the
        work done here, once: see :class:`~.amg.point_decoder.PointGridDecoder`."""
        return PointGridDecoder(self, image_embeddings)

    def postprocess_masks(self, masks: mx.array, input_size: tuple[int, int],
                          original_size: tuple[int, int]) -> mx.array:
        """Low-res logits ``(B, 256, 256, M)`` → ``(B, H, W, M)`` logits at the original size.

        Bilinear to 1024² (``align_corners=False``, no antialias), crop the padding away
        (``input_size``: the resized image's ``(h, w)``), bilinear to ``original_size``. The
        chain is linear and separable, so it runs as one product per axis, ``R @ mask @ Cᵀ`` with
        ``R (H, 256)`` and ``C (W, 256)`` the chain's products, formed on the host in float64:
        ~10x less work than the two resizes (automatic masks upsample hundreds of masks), equal
        to them within float32 rounding (~1e-7 of the logits' range).
        """
        low_h, low_w = masks.shape[1:3]
        rows = _resize_chain(low_h, int(input_size[0]), int(original_size[0]))
        cols = _resize_chain(low_w, int(input_size[1]), int(original_size[1]))
        with self.on_device():
            rows = mx.array(rows).astype(masks.dtype)
            cols = mx.array(cols).astype(masks.dtype)
            b, _, _, m = masks.shape
            planes = masks.transpose(0, 3, 1, 2).reshape(b * m, low_h, low_w)
            out = cn.ops.resize_masks(planes, rows, cols)  # (B M, H, W)
            out = out.reshape(b, m, rows.shape[0], cols.shape[0])
            return out.transpose(0, 2, 3, 1)


@functools.lru_cache(maxsize=16)
def _resize_chain(low: int, kept: int, original: int) -> np.ndarray:
    """One axis of :meth:`Sam.postprocess_masks`' chain as a float32 ``(original, low)`` matrix:
    ``low`` → ``IMAGE_SIZE``, keep ``kept``, → ``original`` (float64 products; cached, as the
    automatic masks ask for the same sizes batch after batch). Read-only."""
    chain = (bilinear_resize_matrix(kept, original)
             @ bilinear_resize_matrix(low, IMAGE_SIZE, keep=kept)).astype(np.float32)
    chain.flags.writeable = False
    return chain


def infer_encoder(vb: VarBuilder, name: str = "the weights") -> str:
    """The image encoder of the SAM checkpoint behind ``vb``: a key of
    :data:`MOBILE_SAM_ENCODERS` (``"tiny"``) or of ``VIT_CONFIGS`` (``"vit_b"``, ``"vit_l"``,
    ``"vit_h"``), read from the encoder's stem width and, for a ViT, its number of blocks (what
    ``Sam.load(vb, infer_encoder(vb))`` needs). Raises WeightsFileError (naming ``name``) when
    ``vb`` holds no SAM image encoder in candle's layout, or one of another size."""
    enc = vb.pp("image_encoder")
    if enc.contains("patch_embed.seq.2.c.weight"):  # TinyViT's two-conv stem
        width = enc.shape("patch_embed.seq.2.c.weight")[0]
        found = [e for e, c in MOBILE_SAM_ENCODERS.items()
                 if TINY_VIT_CONFIGS[c].embed_dims[0] == width]
        what = f"a TinyViT encoder of stem width {width}"
    elif enc.contains("patch_embed.proj.weight"):  # ViT: one patch-embedding conv
        width = enc.shape("patch_embed.proj.weight")[0]
        depth = 0
        while enc.contains(f"blocks.{depth}.norm1.weight"):
            depth += 1
        found = [v for v, c in VIT_CONFIGS.items() if (c.embed_dim, c.depth) == (width, depth)]
        what = f"a ViT encoder {width} wide with {depth} blocks"
    else:
        raise cn.WeightsFileError(
            f"{name} holds no SAM image encoder in candle's layout (no "
            "image_encoder.patch_embed.seq.2.c.weight or image_encoder.patch_embed.proj.weight)")
    if not found:
        known = ", ".join([*MOBILE_SAM_ENCODERS, *VIT_CONFIGS])
        raise cn.WeightsFileError(f"{name} holds {what}, which is none of {known}")
    return found[0]


def _check_encoder(vb: VarBuilder, wanted: str) -> None:
    """Fail early, naming both, when a checkpoint's encoder is not ``wanted`` (sources without
    an encoder, such as a fresh VarMap, are not checked)."""
    try:
        found = infer_encoder(vb)
    except cn.WeightsFileError:
        return
    if found != wanted:
        raise cn.ShapeMismatchError(
            f"the weights hold SAM with the {found} encoder, not {wanted}: build "
            f"Sam.load(vb, {found!r}) (infer_encoder(vb) reads it from the file; the CLIs: "
            f"--model {found}) or use {wanted} weights")

