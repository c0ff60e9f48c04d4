"""What the SAM task API gives per image: the prompted masks (:class:`SamResult`) or the automatic
ones (:class:`EverythingResult`), with the JSON record ``candle-segment-anything --json`` prints."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from candle_nn_models.image_file import shown
from candle_nn_models.segment_anything.amg import (batched_mask_to_box, box_xyxy_to_xywh,
                                                   coco_encode_rle, mask_to_rle)

from .prompts import Prompts

__all__ = ["EverythingResult", "SamResult", "mask_json"]

Files = Mapping[str, "str | os.PathLike"]


def mask_json(mask: np.ndarray) -> dict[str, Any]:
    """COCO RLE, area and XYWH box of one ``(H, W)`` boolean mask."""
    rle = mask_to_rle(mask[None])[0]
    box = batched_mask_to_box(mask[None])[0]
    return {"segmentation": coco_encode_rle(rle), "area": int(mask.sum()),
            "bbox": box_xyxy_to_xywh(box).tolist()}


def _head(path: Path | None, shape: tuple[int, int], mode: str) -> dict[str, Any]:
    return {"image": None if path is None else shown(path), "width": shape[1],
            "height": shape[0], "mode": mode}


def _with_files(record: dict, files: Files | None) -> dict:
    if files is not None:
        record["files"] = {k: None if v is None else shown(v) for k, v in files.items()}
    return record


@dataclass(frozen=True)
class SamResult:
    """One image's masks for its prompts.

    Attributes:
        path: the image file (``None`` for an array or PIL image); ``orig_shape`` its
            ``(height, width)``.
        masks: ``(C, H, W)`` bool, ``C`` = 1 (3 with ``multimask``); ``scores`` ``(C,)`` float32
            predicted IoUs; ``logits`` ``(C, H, W)`` float32 mask logits.
        prompts: the prompts, in pixels; ``threshold`` the logit above which a pixel is in a mask.
    """

    path: Path | None
    orig_shape: tuple[int, int]
    masks: np.ndarray
    scores: np.ndarray
    logits: np.ndarray
    prompts: Prompts
    threshold: float = 0.0

    @property
    def best(self) -> int:
        """The index of the best-scored mask."""
        return int(np.argmax(self.scores))

    def to_json(self, files: Files | None = None) -> dict[str, Any]:
        """The record ``candle-segment-anything --json`` prints (``files``: what it wrote, which
        it adds; without them the ``<stem>_masks.json`` it saves): the image and its size, the
        prompts, the threshold and each mask (COCO RLE ``segmentation``, ``area``, XYWH
        ``bbox``, ``predicted_iou``, ``best``)."""
        best = self.best
        record = _head(self.path, self.orig_shape, "prompts")
        record.update(prompts=self.prompts.to_json(), threshold=self.threshold,
                      masks=[{**mask_json(mask), "predicted_iou": float(score), "best": i == best}
                             for i, (mask, score) in enumerate(zip(self.masks, self.scores))])
        return _with_files(record, files)


@dataclass(frozen=True)
class EverythingResult:
    """One image's automatic masks.

    Attributes:
        path, orig_shape: as :class:`SamResult`'s.
        records: the generator's records, best first within each crop: ``segmentation`` (COCO
            RLE), ``area``, ``bbox`` (XYWH), ``predicted_iou``, ``point_coords``,
            ``stability_score``, ``crop_box``.
        points: how many prompt points the grid had.
    """

    path: Path | None
    orig_shape: tuple[int, int]
    records: list[dict[str, Any]]
    points: int

    @property
    def masks(self) -> np.ndarray:
        """``(N, H, W)`` bool, one per record."""
        from pycocotools import mask as mask_utils

        masks = [mask_utils.decode({"size": r["segmentation"]["size"],
                                    "counts": r["segmentation"]["counts"].encode()})
                 for r in self.records]
        return np.array(masks, dtype=bool).reshape(len(masks), *self.orig_shape)

    def to_json(self, files: Files | None = None) -> dict[str, Any]:
        """The record ``candle-segment-anything --everything --json`` prints (``files``: what it
        wrote; without them the ``<stem>_masks.json`` it saves)."""
        record = _head(self.path, self.orig_shape, "everything")
        record["masks"] = self.records
        return _with_files(record, files)
