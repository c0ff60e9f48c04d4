"""Run-length encodings of binary masks, in the layouts COCO tools read.

An *uncompressed RLE* is ``{"size": [h, w], "counts": [n0, n1, ...]}``: alternating run lengths of
0s and 1s (starting with 0s, so ``n0`` may be 0) over the mask flattened in column-major
(Fortran) order. A *COCO RLE* is the same runs compressed into pycocotools' ASCII string form
(``"counts"`` is a ``str``), what ``pycocotools.mask.decode`` and COCO JSON files hold.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def mask_to_rle(masks: np.ndarray) -> list[dict[str, Any]]:
    """Uncompressed RLEs of ``(B, H, W)`` boolean masks, one dict per mask."""
    b, h, w = masks.shape
    flat = np.asarray(masks, dtype=bool).transpose(0, 2, 1).reshape(b, h * w)
    out = []
    for row in flat:
        change = np.flatnonzero(row[1:] != row[:-1]) + 1
        bounds = np.concatenate([[0], change, [h * w]])
        counts = [] if not row[0] else [0]
        counts.extend(np.diff(bounds).tolist())
        out.append({"size": [h, w], "counts": counts})
    return out


def rle_to_mask(rle: dict[str, Any]) -> np.ndarray:
    """The ``(H, W)`` boolean mask of an uncompressed RLE."""
    h, w = rle["size"]
    counts = np.asarray(rle["counts"], dtype=np.int64)
    values = np.arange(len(counts)) % 2 == 1
    return np.repeat(values, counts).reshape(w, h).transpose()


def area_from_rle(rle: dict[str, Any]) -> int:
    """Number of foreground pixels of an uncompressed RLE."""
    return int(sum(rle["counts"][1::2]))


def coco_encode_rle(uncompressed_rle: dict[str, Any]) -> dict[str, Any]:
    """Uncompressed RLE → COCO's compressed RLE ``{"size": [h, w], "counts": str}`` (JSON-ready).

    Uses pycocotools, the COCO reference implementation, so files load in every COCO tool.
    """
    from pycocotools import mask as mask_utils

    h, w = uncompressed_rle["size"]
    rle = mask_utils.frPyObjects(uncompressed_rle, h, w)
    rle["counts"] = rle["counts"].decode("utf-8")
    return rle
