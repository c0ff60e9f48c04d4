"""The compiled last-axis concatenation (backends/cpu/concat.py, csrc/concat.cpp) against
``mx.concatenate`` (the op's reference), bit for bit: contiguous inputs, ``mx.split`` pieces
(read in place), transposed and broadcast views (read element by element), empty pieces, 1-3
threads; which calls take it; gradients through the reference."""

from __future__ import annotations

import io

import mlx.core as mx
import numpy as np
import pytest

import candle_nn as cn
from candle_nn.backends.cpu import concat, kernels as cpu_native

NATIVE = cpu_native.module() is not None
needs_native = pytest.mark.skipif(not NATIVE, reason="the compiled kernels are not built here")


def _pieces() -> list[mx.array]:
    rng = np.random.default_rng(7)
    whole = mx.array(rng.standard_normal((2, 9, 11, 24), dtype=np.float32))
    a, b = mx.split(whole, [5], axis=-1)                        # slices of the last axis
    t = mx.array(rng.standard_normal((2, 11, 9, 3), dtype=np.float32)).transpose(0, 2, 1, 3)
    wide = mx.broadcast_to(mx.array(rng.standard_normal((1, 1, 11, 4), dtype=np.float32)),
                           (2, 9, 11, 4))                      # stride-0 rows
    lane = mx.broadcast_to(mx.array(np.float32(np.nan)), (2, 9, 11, 2))  # stride-0 last axis
    empty = mx.zeros((2, 9, 11, 0))
    return [a, t, b, empty, wide, lane, mx.array(rng.standard_normal((2, 9, 11, 1),
                                                                     dtype=np.float32))]


@needs_native
def test_concat_kernel_matches_mx_concatenate_bit_for_bit() -> None:
    xs = _pieces()
    results = []
    try:
        for threads in (1, 2, 3):
            cpu_native.module().set_num_threads(threads)
            with mx.stream(mx.cpu):
                results.append(np.array(cpu_native.module().concat_last(xs)))
    finally:
        cpu_native.sync_threads(force=True)
    with mx.stream(mx.cpu):
        ref = np.array(mx.concatenate(xs, axis=-1))
    assert ref.shape == (2, 9, 11, 5 + 3 + 19 + 0 + 4 + 2 + 1)
    for ours in results:
        np.testing.assert_array_equal(ours, ref)


@needs_native
def test_which_concatenations_take_the_kernel() -> None:
    with mx.stream(mx.cpu):
        x = mx.ones((1, 4, 4, 3))
        assert concat.applies([x, x])
        assert not concat.applies([x])                               # nothing to join
        assert not concat.applies([x, x.astype(mx.float16)])
        assert not concat.applies([x, mx.ones((1, 4, 5, 3))])        # other axes differ
        graph = io.StringIO()
        mx.export_to_dot(graph, cn.ops.concat_last([x, x * 2]))
        assert "CandleNNConcatLast" in graph.getvalue()

        def loss(a, b):
            return (cn.ops.concat_last([a, b]) ** 2 * mx.arange(6.0)).sum()

        a, b = mx.array(np.arange(48.0, dtype=np.float32).reshape(1, 4, 4, 3)), x
        ours = mx.grad(loss, argnums=(0, 1))(a, b)
        ref = mx.grad(lambda a, b: (mx.concatenate([a, b], axis=-1) ** 2
                                    * mx.arange(6.0)).sum(), argnums=(0, 1))(a, b)
    for g, r in zip(ours, ref):
        np.testing.assert_array_equal(np.array(g), np.array(r))
    with cn.ops.disabled("concat"), mx.stream(mx.cpu):
        graph = io.StringIO()
        mx.export_to_dot(graph, cn.ops.concat_last([x, x * 2]))
        assert "CandleNNConcatLast" not in graph.getvalue()
