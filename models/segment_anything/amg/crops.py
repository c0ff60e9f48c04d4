"""Point grids and the overlapping image crops automatic mask generation prompts over."""

from __future__ import annotations

import math
from itertools import product
from typing import Any, Iterator

import numpy as np


def build_point_grid(n_per_side: int) -> np.ndarray:
    """``(n², 2)`` points ``(x, y)`` evenly spaced in ``[0, 1]²`` (cell centres), row by row."""
    offset = 1 / (2 * n_per_side)
    side = np.linspace(offset, 1 - offset, n_per_side)
    xs = np.tile(side[None, :], (n_per_side, 1))
    ys = np.tile(side[:, None], (1, n_per_side))
    return np.stack([xs, ys], axis=-1).reshape(-1, 2)


def build_all_layer_point_grids(n_per_side: int, n_layers: int,
                                scale_per_layer: int) -> list[np.ndarray]:
    """One grid per crop layer ``0..n_layers``; layer ``i`` has ``n_per_side / scale**i`` a side."""
    return [build_point_grid(int(n_per_side / (scale_per_layer ** i)))
            for i in range(n_layers + 1)]


def generate_crop_boxes(im_size: tuple[int, int], n_layers: int,
                        overlap_ratio: float) -> tuple[list[list[int]], list[int]]:
    """Crop boxes ``[x0, y0, x1, y1]`` and their layer index: the whole image (layer 0), then
    ``(2**i)²`` overlapping crops for each layer ``i = 1..n_layers``.

    ``im_size`` is ``(H, W)``. Crops of layer ``i`` overlap by ``overlap_ratio`` of the short side
    scaled by ``2 / 2**i``.
    """
    im_h, im_w = im_size
    short_side = min(im_h, im_w)
    crop_boxes, layer_idxs = [[0, 0, im_w, im_h]], [0]

    def crop_len(orig_len: int, n_crops: int, overlap: int) -> int:
        return int(math.ceil((overlap * (n_crops - 1) + orig_len) / n_crops))

    for i_layer in range(n_layers):
        n_crops_per_side = 2 ** (i_layer + 1)
        overlap = int(overlap_ratio * short_side * (2 / n_crops_per_side))
        crop_w = crop_len(im_w, n_crops_per_side, overlap)
        crop_h = crop_len(im_h, n_crops_per_side, overlap)
        x0s = [int((crop_w - overlap) * i) for i in range(n_crops_per_side)]
        y0s = [int((crop_h - overlap) * i) for i in range(n_crops_per_side)]
        for x0, y0 in product(x0s, y0s):
            crop_boxes.append([x0, y0, min(x0 + crop_w, im_w), min(y0 + crop_h, im_h)])
            layer_idxs.append(i_layer + 1)
    return crop_boxes, layer_idxs


def batch_iterator(batch_size: int, *args: Any) -> Iterator[list[Any]]:
    """Slices ``[a[k:k + batch_size] for a in args]`` over equally long sequences."""
    if not args or any(len(a) != len(args[0]) for a in args):
        raise ValueError("batch_iterator needs one or more sequences of the same length")
    n = len(args[0])
    for start in range(0, n, batch_size):
        yield [a[start:start + batch_size] for a in args]
