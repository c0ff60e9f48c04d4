"""Batches prepared by a thread pool ahead of the model, for every trainer.

Threads, not processes: Pillow's decode, resize and warps and NumPy release the GIL, so plain
threads (``concurrent.futures``) prepare samples in parallel with each other and with MLX's
compute (which runs outside the GIL too), with none of a process pool's start-up, pickling of
every batch or copies. :class:`BatchLoader` keeps ``prefetch`` batches in flight; samples come
back in order whichever thread finishes first, so a seeded run is the same with any number of
workers.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

import numpy as np

from candle_nn import CandleNNError
from candle_nn_models.image_decode import decode_rgb

__all__ = ["BatchLoader", "labelled_images", "stack_labelled"]

Sample = TypeVar("Sample")
Transform = Callable[[np.ndarray, int], np.ndarray]  # (uint8 HWC image, its index) -> float HWC


class BatchLoader(Generic[Sample]):
    """Iterate ``collate([make(i) for i in batch])`` over ``batches``.

    Args:
        batches: each batch's sample indices, in the order to yield them.
        make: one sample from its index (runs on a thread of ``pool``).
        collate: a batch's samples, in order, to what the loop consumes.
        pool: the shared worker pool; ``prefetch``: batches prepared ahead.
    """

    def __init__(self, batches: Sequence[Sequence[int]], make: Callable[[int], Sample],
                 collate: Callable[[list[Sample]], Any], pool: ThreadPoolExecutor,
                 prefetch: int = 2) -> None:
        self.batches, self.make, self.collate = batches, make, collate
        self.pool, self.prefetch = pool, max(1, prefetch)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        pending: deque[list[Future]] = deque()
        try:
            for batch in self.batches:
                pending.append([self.pool.submit(self.make, int(i)) for i in batch])
                if len(pending) > self.prefetch:
                    yield self.collate([f.result() for f in pending.popleft()])
            while pending:
                yield self.collate([f.result() for f in pending.popleft()])
        finally:
            for futures in pending:
                for f in futures:
                    f.cancel()


def labelled_images(paths: Sequence[Path], labels: np.ndarray,
                    transform: Transform) -> Callable[[int], tuple[np.ndarray, int]]:
    """``make`` for a classifier: image ``i`` decoded and transformed, and its label."""

    def make(index: int) -> tuple[np.ndarray, int]:
        path = paths[index]
        try:
            rgb = decode_rgb(path)
        except Exception as exc:  # it decoded when the folder was read: changed since
            raise CandleNNError(f"{path}: cannot decode any more ({type(exc).__name__}: "
                                f"{exc}); fix or remove it and resume") from None
        return transform(rgb, index), int(labels[index])

    return make


def stack_labelled(samples: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray]:
    """``(images (B, S, S, 3), labels (B,) int32)``."""
    return (np.stack([image for image, _ in samples]),
            np.asarray([label for _, label in samples], dtype=np.int32))
