"""Batches of decoded, transformed images, prepared by a thread pool ahead of the model.

Pillow releases the GIL while it decodes and resizes, and NumPy while it normalises, so plain
threads (``concurrent.futures``) decode in parallel with each other and with MLX's compute, with
none of a process pool's start-up, pickling or copying of every batch. :class:`BatchLoader`
keeps ``prefetch`` batches in flight; their images are returned in order, whichever thread
finishes first.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from candle_nn import CandleNNError
from candle_nn_models.image_folder import decode_rgb

Transform = Callable[[np.ndarray, int], np.ndarray]  # (uint8 HWC image, its index) -> float HWC


class BatchLoader:
    """Iterate ``(images (B, S, S, 3) float32, labels (B,) int32)`` over ``batches``.

    Args:
        paths, labels: the images and their class indices.
        batches: each batch's indices into ``paths``, in the order to yield them.
        transform: ``transform(rgb, index)``: one decoded image to the model's input.
        pool: the shared worker pool; ``prefetch``: batches decoded ahead.
    """

    def __init__(self, paths: Sequence[Path], labels: np.ndarray,
                 batches: Sequence[Sequence[int]], transform: Transform,
                 pool: ThreadPoolExecutor, prefetch: int = 2) -> None:
        self.paths, self.labels, self.batches = paths, labels, batches
        self.transform, self.pool, self.prefetch = transform, pool, max(1, prefetch)

    def __len__(self) -> int:
        return len(self.batches)

    def _load(self, index: int) -> np.ndarray:
        path = self.paths[index]
        try:
            rgb = decode_rgb(path)
        except Exception as exc:  # it decoded when the folder was read: changed since
            raise CandleNNError(f"{path}: cannot decode any more ({type(exc).__name__}: "
                                f"{exc}); fix or remove it and resume") from None
        return self.transform(rgb, index)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        pending: deque[tuple[Sequence[int], list[Future]]] = deque()
        try:
            for batch in self.batches:
                pending.append((batch, [self.pool.submit(self._load, i) for i in batch]))
                if len(pending) >= self.prefetch:
                    yield self._collect(*pending.popleft())
            while pending:
                yield self._collect(*pending.popleft())
        finally:
            for _, futures in pending:
                for f in futures:
                    f.cancel()

    def _collect(self, batch: Sequence[int],
                 futures: list[Future]) -> tuple[np.ndarray, np.ndarray]:
        images = np.stack([f.result() for f in futures])
        return images, np.asarray([self.labels[i] for i in batch], dtype=np.int32)
