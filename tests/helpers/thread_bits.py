"""The C++ kernels' outputs on 1, 2 and 3 threads, to check that the thread count changes no bit."""

from __future__ import annotations

from typing import Callable

import mlx.core as mx
import numpy as np

from candle_nn.backends.cpu import kernels as cpu_native


def outputs_on_1_2_3_threads(run: Callable[[], list[mx.array]]) -> list[list[np.ndarray]]:
    """``run()`` (a list of kernel outputs) on the CPU stream with the kernels on 1, 2 and 3
    threads; the session's thread count is restored after."""
    kernels = cpu_native.module()
    results = []
    try:
        for threads in (1, 2, 3):
            kernels.set_num_threads(threads)
            with mx.stream(mx.cpu):
                results.append([np.array(out) for out in run()])
    finally:
        cpu_native.sync_threads(force=True)
    return results


def assert_same_bits_on_1_2_3_threads(run: Callable[[], list[mx.array]]) -> list[np.ndarray]:
    """:func:`outputs_on_1_2_3_threads` equal bit for bit; returns the 1-thread outputs."""
    results = outputs_on_1_2_3_threads(run)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)
    return results[0]
