"""MobileSAM's own ``SamAutomaticMaskGenerator`` (PyPI ``mobilesam-mirror``, imports as
``mobile_sam``) on the fixture weights, as the reference for our generator: the import and the
weights conversion live in ``benchmarks/mobile_sam_reference.py`` (shared with
``candle-nn-bench``); the child process and the small ViT reference are the tests' own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.mobile_sam_reference import build_reference_sam, import_mobile_sam  # noqa: F401


# -- the reference in a child process ---------------------------------------------------------
# torch's CPU matmuls crash (SIGSEGV) in a process where candle_nn has preloaded the pip OpenBLAS
# (ngsolve-openblas 0.3.33) — a symbol clash between the two BLAS builds; Debian's 0.3.21 is fine.
# So every reference run that multiplies matrices happens in a fresh interpreter that never
# imports candle_nn, and hands its records back pickled.
_CHILD = r"""
import pickle, sys
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
torch.set_num_threads(2)
from _mobile_sam_reference import build_reference_sam, import_mobile_sam, build_vit_reference
job = pickle.load(open(sys.argv[2], "rb"))
mobile_sam, _ = import_mobile_sam()
if job["model"] == "vit":
    model = build_vit_reference(job["weights"])
else:
    model = build_reference_sam(job["weights"])
calls = None
if job["stand_in"]:
    from _sam_decoder_stand_in import install_on_reference
    calls = install_on_reference(model)
out = []
for kwargs in job["cases"]:
    if calls is not None:
        calls.clear()
    records = mobile_sam.SamAutomaticMaskGenerator(model, **kwargs).generate(job["image"])
    out.append((records, None if calls is None else len(calls)))
pickle.dump(out, open(sys.argv[3], "wb"))
"""


def reference_records(weights, image: np.ndarray, cases: list[dict], *, stand_in: bool = False,
                      model: str = "vit_t") -> list[tuple[list[dict], int | None]]:
    """MobileSAM's generator records for each ``cases`` entry (and its encoder call count with
    the stand-in), computed in a child process (see above)."""
    import os
    import pickle
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        job, result = Path(tmp) / "job.pkl", Path(tmp) / "out.pkl"
        job.write_bytes(pickle.dumps({"weights": str(weights), "image": image, "cases": cases,
                                      "stand_in": stand_in, "model": model}))
        env = {**os.environ, "CANDLE_NN_BLAS": "off"}
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(Path(__file__).parent),
                               str(job), str(result)], capture_output=True, text=True,
                              env=env, timeout=1200)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return pickle.loads(result.read_bytes())


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
