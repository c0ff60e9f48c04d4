"""A deterministic stand-in for SAM's image encoder and mask decoder, installed the same way on our
model and on MobileSAM's, so that the automatic mask generators can be compared on masks that
depend on the prompt point (random fixture weights give nearly the same mask for every point).

For a point ``p`` in the 1024 input frame, mask ``k`` (of 3) is a disc around ``p`` with a radius
and an edge steepness that vary smoothly with ``p`` and ``k`` (so stability scores and areas vary),
plus a small island beside it and a small hole inside it (for ``min_mask_region_area``); its
predicted IoU varies smoothly in ``0.62..1.0``. Smooth functions keep both sides' outputs equal
to float32 rounding even though their point coordinates differ in the last bit.
"""

from __future__ import annotations

import numpy as np

GRID = (np.arange(256) + 0.5) * 4.0  # low-res cell centres in the 1024 frame


def stand_in_outputs(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``points`` ``(B, 2)`` (x, y) in the 1024 frame → low-res logits ``(B, 3, 256, 256)`` and
    IoU predictions ``(B, 3)``, float32."""
    p = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    x, y = p[:, 0, None, None, None], p[:, 1, None, None, None]  # (B, 1, 1, 1)
    k = np.arange(3, dtype=np.float64)[None, :, None, None]  # (1, 3, 1, 1)
    gx, gy = GRID[None, None, None, :], GRID[None, None, :, None]
    phase = x / 97.0 + y / 61.0
    radius = 100.0 + 35.0 * k + 45.0 * np.sin(phase + 1.7 * k)
    slope = 1.5 + 1.2 * np.cos(0.8 * phase - k)
    disc = (radius - np.hypot(gx - x, gy - y)) / slope
    # An island beside the disc and a hole inside it, of varying size.
    ix, iy = x + (radius + 40.0) * np.cos(phase), y + (radius + 40.0) * np.sin(phase)
    island = (12.0 + 10.0 * np.sin(2.0 * phase + k) - np.hypot(gx - ix, gy - iy)) / slope
    hx, hy = x + 0.4 * radius * np.sin(phase), y + 0.4 * radius * np.cos(phase)
    hole = (np.hypot(gx - hx, gy - hy) - (9.0 + 7.0 * np.cos(3.0 * phase - k))) / slope
    logits = np.maximum(np.minimum(disc, hole), island)
    iou = 0.81 + 0.19 * np.sin(1.3 * phase[:, :, 0, 0] + 0.6 * k[:, :, 0, 0])
    return logits.astype(np.float32), iou.astype(np.float32)


class StandInGridDecoder:
    """The stand-in behind our generator's two-step decoder (``Sam.point_grid_decoder``):
    :meth:`decode` gives the IoUs and keeps the logits, :meth:`masks` picks the kept ones."""

    def decode(self, coords):
        import mlx.core as mx

        logits, iou = stand_in_outputs(np.array(coords))
        return mx.array(iou), mx.array(logits)

    def masks(self, state, prompts, which):
        import mlx.core as mx

        return state[mx.array(np.asarray(prompts)), mx.array(np.asarray(which))]


def install_on_ours(sam) -> list:
    """Replace our Sam's encoder (zeros) and decoder (the stand-in, on both the prompt path
    and the automatic masks' point-grid decoder); returns the list that records each encoder
    input shape."""
    import mlx.core as mx

    calls, seen = [], {}
    sam.image_encoder.forward = lambda x: calls.append(x.shape) or mx.zeros((1, 64, 64, 256))
    prompt_forward = sam.prompt_encoder.forward

    def prompt_encoder(points=None, boxes=None, masks=None):
        seen["points"] = np.array(points[0])[:, 0, :]
        return prompt_forward(points, boxes, masks)

    def mask_decoder(image_embeddings, image_pe, sparse, dense, multimask_output):
        assert multimask_output
        logits, iou = stand_in_outputs(seen.pop("points"))
        return mx.array(logits.transpose(0, 2, 3, 1)), mx.array(iou)

    sam.prompt_encoder.forward, sam.mask_decoder.forward = prompt_encoder, mask_decoder
    sam.point_grid_decoder = lambda image_embeddings: StandInGridDecoder()
    return calls


def install_on_reference(model) -> list:
    """The same stand-in on MobileSAM's torch ``Sam``."""
    import torch

    calls, seen = [], {}
    model.image_encoder.forward = lambda x: calls.append(tuple(x.shape)) or torch.zeros(
        1, 256, 64, 64)
    prompt_forward = model.prompt_encoder.forward

    def prompt_encoder(points=None, boxes=None, masks=None):
        seen["points"] = points[0][:, 0, :].float().numpy()
        return prompt_forward(points, boxes, masks)

    def mask_decoder(image_embeddings, image_pe, sparse_prompt_embeddings,
                     dense_prompt_embeddings, multimask_output):
        assert multimask_output
        logits, iou = stand_in_outputs(seen.pop("points"))
        return torch.from_numpy(logits), torch.from_numpy(iou)

    model.prompt_encoder.forward, model.mask_decoder.forward = prompt_encoder, mask_decoder
    return calls
