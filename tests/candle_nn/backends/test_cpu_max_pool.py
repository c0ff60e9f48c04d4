"""The compiled max pool (backends/cpu/max_pool.py, csrc/max_pool.cpp) against MLX's own pooling
(the op's reference), bit for bit: kernel, stride and padding combinations, channel counts off
the 8-lane vector, NaN and infinities, batches, 1-3 threads; which calls take it."""

from __future__ import annotations

import io

import mlx.core as mx
import numpy as np
import pytest

import candle_nn as cn
from candle_nn.backends.cpu import kernels as cpu_native, max_pool

NATIVE = cpu_native.module() is not None
needs_native = pytest.mark.skipif(not NATIVE, reason="the compiled kernels are not built here")


def _x(shape: tuple[int, ...], seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[3], flat[11] = np.nan, -np.inf  # NaN wins its windows, as MLX's max
    flat[-10], flat[-1] = np.nan, np.nan  # also in the last channels (8-lane and scalar tails)
    x[0, 1, 1, 1] = np.inf
    return x


@needs_native
@pytest.mark.parametrize("shape, kernel, stride, padding", [
    ((1, 17, 15, 64), (3, 3), (2, 2), (1, 1)),   # ResNet's stem pool, odd sizes
    ((2, 9, 9, 13), (5, 5), (1, 1), (2, 2)),     # YOLOv8's SPPF, channels off the vector
    ((1, 8, 10, 3), (2, 3), (2, 1), (1, 0)),     # asymmetric kernel, stride and padding
    ((3, 6, 7, 20), (2, 2), (2, 2), (0, 0)),     # no padding, rows left over
    ((1, 7, 9, 45), (3, 3), (2, 2), (1, 1)),     # 32 + 8 + 5 channels
])
def test_max_pool_kernel_matches_mlx_bit_for_bit(shape, kernel, stride, padding) -> None:
    x = mx.array(_x(shape, seed=sum(shape)))
    results = []
    try:
        for threads in (1, 2, 3):
            cpu_native.module().set_num_threads(threads)
            with mx.stream(mx.cpu):
                results.append(np.array(cpu_native.module().max_pool2d(x, kernel, stride,
                                                                        padding)))
    finally:
        cpu_native.sync_threads(force=True)
    with mx.stream(mx.cpu):
        ref = np.array(cn.ops.max_pool2d.reference(x, kernel, stride, padding))
    assert np.isnan(ref).any() and np.isinf(ref).any()
    for ours in results:
        assert ours.shape == ref.shape
        np.testing.assert_array_equal(ours, ref)


@needs_native
def test_which_max_pools_take_the_kernel() -> None:
    with mx.stream(mx.cpu):
        x = mx.zeros((1, 8, 8, 4))
        assert max_pool.applies(x, (3, 3), (2, 2), (1, 1))
        assert not max_pool.applies(x, (3, 3), (1, 1), (2, 2))  # padding over half the kernel
        assert not max_pool.applies(x.astype(mx.float16), (3, 3), (2, 2), (1, 1))
        assert not max_pool.applies(x[0], (3, 3), (2, 2), (1, 1))
        # a concrete call runs the kernel's primitive; under mx.grad the other paths run
        graph = io.StringIO()
        mx.export_to_dot(graph, cn.ops.max_pool2d(x, (3, 3), (2, 2), (1, 1)))
        assert "CandleNNMaxPool2d" in graph.getvalue()
        xs = mx.array(np.arange(72, dtype=np.float32).reshape(1, 6, 6, 2))
        grad = mx.grad(lambda a: cn.ops.max_pool2d(a, (3, 3), (2, 2), (1, 1)).sum())(xs)
        ref = mx.grad(lambda a: cn.ops.max_pool2d.reference(a, (3, 3), (2, 2), (1, 1)).sum())(xs)
        np.testing.assert_array_equal(np.array(grad), np.array(ref))
