"""Data parallelism over ``mx.distributed`` for the trainers (``mlx.launch``).

Every process (rank) runs the same trainer; each step's global batch is the same list of image
indices on every rank (seeded), and rank ``r`` of ``W`` takes its contiguous share
(:func:`local_slice`). Gradients are reduced over the ranks (:meth:`DataParallel.sum_gradients`,
:meth:`DataParallel.average_gradients`), so every rank applies the same update to the same
weights; only rank 0 (:attr:`DataParallel.is_main`) writes files and prints. One process
(``mlx.launch`` not used) is a group of size 1, where all of this costs nothing.
"""

from __future__ import annotations

from typing import Any, Mapping

from candle_nn import CandleNNError  # first: candle_nn sets MLX's CPU BLAS up before it loads
import mlx.core as mx
import mlx.nn as nn
import numpy as np

__all__ = ["DataParallel", "capped_batch", "check_batch_norm_batch", "local_slice"]

REDUCE_BYTES = 32 * 1024 ** 2  # arrays are concatenated into all-reduces of about this size


def local_slice(count: int, rank: int, world: int) -> slice:
    """Rank ``rank``'s contiguous share of ``count`` items (the first ranks take one more)."""
    base, extra = divmod(count, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def check_batch_norm_batch(batch: int, world: int, imgsz: int, option: str) -> None:
    """Refuse a global ``batch`` whose share per process leaves a train-mode BatchNorm one value
    a channel (PyTorch's "Expected more than 1 value per channel when training"): its smallest
    feature map is ``ceil(imgsz / 32)`` a side. ``--batch 1`` trains at 64 pixels, as in
    ultralytics; not at 32."""
    side = -(-imgsz // 32)
    per_process = batch // world
    if per_process * side * side < 2:
        raise CandleNNError(f"{option} {batch} at --imgsz {imgsz} leaves BatchNorm one value a "
                            f"channel ({per_process} image{'s' if per_process != 1 else ''} a "
                            f"process of a {side}x{side} last feature map), too few for its "
                            f"batch statistics; pass {option} {2 * world} or more, a larger "
                            "--imgsz, or --freeze-bn")


def capped_batch(batch: int, images: int, world: int) -> int:
    """The batch a run takes: ``batch``, or all ``images`` when they are fewer (as ultralytics'
    data loader), rounded down to split evenly over ``world`` processes."""
    return batch if batch <= images else max(images - images % world, world)


class DataParallel:
    """This process's place in ``group`` (``None``: ``mx.distributed.init()``) and the
    collective operations the trainers use."""

    def __init__(self, group: "mx.distributed.Group | None" = None) -> None:
        self.group = group if group is not None else mx.distributed.init()
        self.rank, self.world = self.group.rank(), self.group.size()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def check_batch(self, batch: int, option: str) -> None:
        """Refuse a global batch that does not split evenly over the processes."""
        if batch % self.world:
            raise CandleNNError(f"{option} {batch} does not split evenly over {self.world} "
                                f"processes; pass a multiple of {self.world}")

    def share(self, indices: np.ndarray) -> np.ndarray:
        """This rank's part of one global batch of ``indices``."""
        return indices[local_slice(len(indices), self.rank, self.world)]

    def all_sum(self, values: mx.array) -> mx.array:
        return mx.distributed.all_sum(values, group=self.group) if self.world > 1 else values

    def sum_values(self, values: list[float]) -> np.ndarray:
        """Float64 sums over the ranks of a few numbers (counts, loss totals)."""
        if self.world == 1:
            return np.asarray(values, dtype=np.float64)
        return np.asarray(self.all_sum(mx.array(np.asarray(values, dtype=np.float32))),
                          dtype=np.float64)

    def average_gradients(self, grads: Any) -> Any:
        """The ranks' mean gradient (``mlx.nn.average_gradients``)."""
        return nn.average_gradients(grads, group=self.group) if self.world > 1 else grads

    def sum_gradients(self, grads: Mapping[str, mx.array]) -> dict[str, mx.array]:
        """The ranks' sums of the flat ``{name: gradient}`` ``grads`` (the same names, in the
        same order, on every rank): arrays concatenated into all-reduces of about
        :data:`REDUCE_BYTES`, split back."""
        if self.world == 1:
            return dict(grads)
        items = list(grads.items())
        out: dict[str, mx.array] = {}
        start, size = 0, 0
        for i, (_, g) in enumerate(items):
            size += g.nbytes
            if size >= REDUCE_BYTES or i == len(items) - 1:
                part = items[start:i + 1]
                big = self.all_sum(mx.concatenate([g.reshape(-1) for _, g in part]))
                cuts = np.cumsum([g.size for _, g in part])[:-1].tolist()
                out.update((k, piece.reshape(g.shape))
                           for (k, g), piece in zip(part, mx.split(big, cuts)))
                start, size = i + 1, 0
        return out
