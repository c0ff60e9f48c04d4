"""candle_nn's CUDA kernels (candle_nn/cuda_kernels.py) against the MLX ops they replace, on
the GPU machine: same inputs, relative error and median time of each.

    python -m benchmarks.bench_gpu_kernels
"""
from __future__ import annotations

import statistics
import sys
import time

import candle_nn as cn
import mlx.core as mx
import mlx.nn as nn
import numpy as np

from candle_nn.backends.cuda import kernels as ck
from candle_nn_models.yolo_v8_head import Dfl


def mlx_max_pool(x, k, s, p):
    return nn.MaxPool2d(k, s, p)(x)


def bench(fn, iters=30):
    for _ in range(3):
        mx.eval(fn())
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        mx.eval(fn())
        ts.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ts)


def rel(a, b):
    a = np.array(a.astype(mx.float32), dtype=np.float64)
    b = np.array(b.astype(mx.float32), dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def rnd(shape, dtype, seed=0):
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return mx.array(values).astype(dtype)


def main() -> None:
    print("CUDA kernels in use:", {k: ck.on_cuda(k) for k in ("depthwise", "dfl", "max_pool")})
    for dt in (mx.float32, mx.float16):
        print(f"== {dt}")
        # depthwise (MobileSAM shapes)
        for (b, h, c, s) in [(1, 256, 256, 1), (1, 64, 160, 1), (8, 256, 256, 1), (8, 64, 320, 1)]:
            x = rnd((b, h, h, c), dt, 1)
            w = rnd((c, 3, 3, 1), dt, 2) * 0.3
            bias = rnd((c,), dt, 3)
            def ref():
                return mx.conv2d(x, w, stride=s, padding=1, groups=c) + bias

            def new():
                return ck.depthwise_conv2d(x, w, bias, (s, s), (1, 1))

            err = rel(new(), ref())
            print(f"depthwise b{b} {h}x{h}x{c} s{s}: mlx {bench(ref):.3f} ms  "
                  f"kernel {bench(new):.3f} ms  err {err:.2e}")
        # max pool
        for (b, h, c, k, s, p) in [(32, 112, 64, 3, 2, 1)]:
            x = rnd((b, h, h, c), dt, 4)
            def ref():
                return mlx_max_pool(x, k, s, p)

            def new():
                return ck.max_pool2d(x, (k, k), (s, s), (p, p))

            err = rel(new(), ref())
            print(f"maxpool b{b} {h}x{h}x{c} k{k}s{s}: mlx {bench(ref):.3f} ms  "
                  f"kernel {bench(new):.3f} ms  err {err:.2e}")
        # DFL decode (YOLOv8n head: 8400 anchors)
        for b in (1, 32):
            x = rnd((b, 8400, 64), dt, 11)
            conv = cn.Conv2d(mx.arange(16, dtype=dt).reshape(1, 1, 1, 16), None,
                             device=cn.Device.parse("gpu"))
            dfl = Dfl(conv)
            def ref():
                with cn.ops.disabled("cuda:dfl"):
                    return dfl(x)

            r = ref()
            tr = bench(ref)

            def new():
                return dfl(x)

            print(f"dfl b{b}: mlx {tr:.3f} ms  kernel {bench(new):.3f} ms  err {rel(new(), r):.2e}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
