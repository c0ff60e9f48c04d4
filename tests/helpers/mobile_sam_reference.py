"""MobileSAM's own ``SamAutomaticMaskGenerator`` (PyPI ``mobilesam-mirror``, imports as
``mobile_sam``) on the fixture weights, as the reference for our generator: the import (with its
stand-ins for timm / torchvision) and the weights loading live in
``benchmarks/mobile_sam_reference.py``, shared with ``candle-nn-bench``; the small ViT reference
is the tests' own.
"""

from __future__ import annotations

import numpy as np

from benchmarks.mobile_sam_reference import build_reference_sam, import_mobile_sam


def reference_records(weights, image: np.ndarray, cases: list[dict], *, stand_in: bool = False,
                      model: str = "vit_t") -> list[tuple[list[dict], int | None]]:
    """MobileSAM's generator records for each ``cases`` entry (and its encoder call count with
    the stand-in), on MobileSAM's ``vit_t`` (``model="vit"``: the small ViT of
    ``test_vit_encoder_matches_mobile_sam``) with ``weights``."""
    from helpers.sam_decoder_stand_in import install_on_reference

    mobile_sam, _ = import_mobile_sam()
    ref = build_vit_reference(weights) if model == "vit" else build_reference_sam(weights)
    calls = install_on_reference(ref) if stand_in else None
    out = []
    for kwargs in cases:
        if calls is not None:
            calls.clear()
        records = mobile_sam.SamAutomaticMaskGenerator(ref, **kwargs).generate(image)
        out.append((records, None if calls is None else len(calls)))
    return out


def build_vit_reference(weights):
    """MobileSAM's ``Sam`` with the small ViT of ``test_vit_encoder_matches_mobile_sam``."""
    from functools import partial

    import torch
    from mobile_sam.modeling import (ImageEncoderViT, MaskDecoder, PromptEncoder, Sam,
                                     TwoWayTransformer)
    from safetensors.numpy import load_file

    ref = Sam(
        image_encoder=ImageEncoderViT(depth=2, embed_dim=32, img_size=1024, mlp_ratio=4,
                                      norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
                                      num_heads=2, patch_size=16, qkv_bias=True,
                                      use_rel_pos=True, global_attn_indexes=[1], window_size=14,
                                      out_chans=256),
        prompt_encoder=PromptEncoder(embed_dim=256, image_embedding_size=(64, 64),
                                     input_image_size=(1024, 1024), mask_in_chans=16),
        mask_decoder=MaskDecoder(num_multimask_outputs=3,
                                 transformer=TwoWayTransformer(depth=2, embedding_dim=256,
                                                               mlp_dim=2048, num_heads=8),
                                 transformer_dim=256, iou_head_depth=3, iou_head_hidden_dim=256),
        pixel_mean=[123.675, 116.28, 103.53], pixel_std=[58.395, 57.12, 57.375])
    state = {k: torch.from_numpy(v) for k, v in load_file(str(weights)).items()}
    assert not ref.load_state_dict(state, strict=False).missing_keys
    return ref.eval()
