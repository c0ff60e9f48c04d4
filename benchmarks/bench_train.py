"""Training rows of ``candle-nn-bench``: the time of one optimizer step (forward, loss, backward,
update), candle_nn against PyTorch on the same device in the same run.

A step is what docs/training.md's loop does: a model built for training (``fold_bn=False``,
``train()``: BatchNorm on batch statistics, running statistics updated), cross-entropy on random
labels (YOLOv8: ``DetectionLoss`` on seeded boxes), SGD with momentum 0.9 and weight decay 1e-4,
then ``mx.eval`` of the loss, the model's state and the optimizer's state (PyTorch: the step,
then a device synchronisation). Weights are seeded random (speed does not depend on values).

Figures: ``median_ms`` / ``p90_ms`` are per step at the row's ``batch`` (``batch_median_ms`` the
same median, ``throughput_ips`` images per second), so both ratios of the report are step-time
ratios. ``first_s`` is the first step (graph building, ``mx.compile``'s trace).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from benchmarks.bench_models import BenchModel
from benchmarks.bench_timing import Options, result

SGD = {"lr": 0.01, "momentum": 0.9, "weight_decay": 1e-4}


def train_shape(model: BenchModel, device: str, opts: Options) -> tuple[int, tuple[int, int]]:
    """``(batch, (H, W))`` of a training step: the model's own, or ``--quick``'s small ones."""
    if opts.quick_train:
        return opts.batch or 2, (64, 64)
    return opts.batch or model.batch, model.input_hw


def _timed_steps(step: Callable[[], None], opts: Options) -> dict:
    start = time.perf_counter()
    step()
    first_s = time.perf_counter() - start
    for _ in range(min(opts.warmup, 1)):  # a step is long: one warm-up step is enough
        step()
    times: list[float] = []
    begin = time.perf_counter()
    while len(times) < max(opts.repeat, 1):
        if len(times) >= 3 and time.perf_counter() - begin > opts.budget_s:
            break
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return {"first_s": first_s, "median_ms": 1e3 * float(np.median(times)),
            "p90_ms": 1e3 * float(np.percentile(times, 90)), "runs": len(times)}


def _row(impl: str, model: BenchModel, device: str, batch: int, hw: tuple[int, int],
         timings: dict, **kw: Any) -> dict:
    row = result(impl, model, device, "float32", **kw, **timings, batch=batch,
                 batch_median_ms=timings["median_ms"],
                 throughput_ips=batch / (timings["median_ms"] / 1e3))
    row["input_hw"] = list(hw)
    return row


# -- ours ------------------------------------------------------------------------------------------
def _labels(model: BenchModel, batch: int, hw: tuple[int, int], seed: int) -> tuple:
    """Seeded ``(images NHWC, targets)`` as numpy: class ids, or YOLO boxes."""
    rng = np.random.default_rng(seed)
    x = rng.random((batch, *hw, 3), dtype=np.float32)
    if model.train == "detect":  # (n, 6): image index, class, cx, cy, w, h (normalised)
        n = 4 * batch
        return x, np.concatenate([np.repeat(np.arange(batch), 4)[:, None],
                                  rng.integers(0, 80, (n, 1)), rng.uniform(0.3, 0.7, (n, 2)),
                                  rng.uniform(0.05, 0.3, (n, 2))], axis=1).astype(np.float32)
    return x, rng.integers(0, 1000, batch).astype(np.int32)


def _loss(model: BenchModel) -> Callable:
    """``loss(module, x, y)``: cross-entropy (mean), or YOLOv8's ``DetectionLoss``."""
    import mlx.nn as nn

    if model.train == "detect":
        from candle_nn_models.yolo_v8_loss import DetectionLoss

        criterion = DetectionLoss(num_classes=80)
        # 4 boxes an image (_labels): 8 ground-truth slots, as the trainer pads them
        return lambda m, x, y: criterion(m(x), y, max_boxes=8)[0]
    return lambda m, x, y: nn.losses.cross_entropy(m(x), y, reduction="mean")


def run_ours_train(model: BenchModel, device: str, opts: Options, compiled: bool) -> dict:
    """candle_nn's training step (``mx.compile``-d when ``compiled``)."""
    from benchmarks.ours import OURS, OURS_COMPILED, prepare_ours

    impl = OURS_COMPILED if compiled else OURS
    batch, hw = train_shape(model, device, opts)
    reason = prepare_ours(device, opts)
    if reason:
        return result(impl, model, device, "float32", status="unavailable", reason=reason)
    from functools import partial

    import candle_nn as cn
    import mlx.core as mx

    start = time.perf_counter()
    net = model.build_ours(cn.VarBuilder.from_varmap(cn.VarMap(), seed=opts.seed, device=device))
    mx.eval(net.parameters())
    load_s = time.perf_counter() - start
    opt, step_fn, (x, y) = _sgd_step(model, net, batch, hw, opts.seed)
    if compiled:
        state = [net.state, opt.state]
        step_fn = partial(mx.compile, inputs=state, outputs=state)(step_fn)

    def step() -> None:
        mx.eval(step_fn(x, y), net.state, opt.state)

    timings = _timed_steps(step, opts)
    blas = cn.info()["blas"]
    where = (f"BLAS {blas['name'].split(',')[0]}, {blas['threads'] or '?'} threads"
             if device == "cpu" else f"float32 {cn.float32_precision()}")
    note = f"training step, batch {batch}, train-mode BN, SGD; {where}"
    return _row(impl, model, device, batch, hw, timings, load_s=load_s, version=cn.__version__,
                note=note)


# -- PyTorch ---------------------------------------------------------------------------------------
def run_torch_train(model: BenchModel, device: str, opts: Options,
                    compile_mode: str | None = None) -> dict:
    """PyTorch's training step on the same model (eager, or ``torch.compile`` of the model)."""
    from benchmarks import bench_peers

    impl = "torch" if compile_mode is None else f"torch.compile({compile_mode})"
    batch, hw = train_shape(model, device, opts)
    reason = bench_peers._torch_unavailable(
        model, "torch not installed (pip install 'candle-nn-mlx[bench]')", "reference needs")
    if reason:
        return result(impl, model, device, "float32", status="unavailable", reason=reason)
    import torch

    if device != "cpu" and not torch.cuda.is_available():
        return result(impl, model, device, "float32", status="unavailable",
                      reason="this torch has no CUDA")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    tf32 = opts.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    start = time.perf_counter()
    step = _torch_step(model, device, batch, hw, opts, compile_mode)
    load_s = time.perf_counter() - start
    timings = _timed_steps(step, opts)
    note = f"training step, batch {batch}, train-mode BN, SGD; torch {torch.__version__}"
    return _row(impl, model, device, batch, hw, timings, load_s=load_s,
                version=torch.__version__, note=note)


def _torch_step(model: BenchModel, device: str, batch: int, hw: tuple[int, int], opts: Options,
                compile_mode: str | None = None) -> Callable[[], None]:
    """One PyTorch SGD step of ``model`` (train mode), synchronised; ``step.model`` is the
    module it steps."""
    import torch

    from benchmarks import bench_peers

    dev = bench_peers._torch_device(device)
    torch.manual_seed(opts.seed)
    net = model.build_torch().to(dev).train()
    x_np, y_np = _labels(model, batch, hw, opts.seed)
    x = torch.from_numpy(np.ascontiguousarray(x_np.transpose(0, 3, 1, 2))).to(dev)
    if opts.channels_last and device != "cpu":
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), **SGD)
    forward = torch.compile(net, mode=compile_mode) if compile_mode else net
    if model.train == "detect":  # ultralytics' v8DetectionLoss, as its trainer calls it
        y = torch.from_numpy(y_np).to(dev)
        batch_dict = {"img": x, "batch_idx": y[:, 0], "cls": y[:, 1:2], "bboxes": y[:, 2:6]}

        def loss() -> Any:
            return net.loss(batch_dict, forward(x))[0].sum()
    else:
        y = torch.from_numpy(y_np.astype(np.int64)).to(dev)
        criterion = torch.nn.CrossEntropyLoss()

        def loss() -> Any:
            return criterion(forward(x), y)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()
        if device != "cpu":
            torch.cuda.synchronize()

    step.model = net  # type: ignore[attr-defined]  # the stepped module, for tests
    return step


# -- A/B of the CPU training paths, in one process -------------------------------------------
# What each setting switches off (candle_nn.ops.disable): "mlx" differentiates MLX's own ops
# (MLX's conv and BatchNorm VJPs), "ours" is the default.
TRAIN_PATHS = ("conv_grad", "batch_norm_vjp")
SETTINGS: dict[str, tuple[str, ...]] = {"mlx": TRAIN_PATHS, "ours": ()}


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.bench_train``: training steps with the CPU training paths on and
    off, round-robin in ONE process (a busy shared machine slows both alike), eager and
    ``mx.compile``-d; prints each setting's median step and the ratios to ``ours``."""
    import argparse
    import statistics

    import candle_nn as cn  # before mlx: picks the CPU BLAS

    from benchmarks.bench_models import MODELS, TRAIN_MODELS

    p = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["resnet18-train"], choices=TRAIN_MODELS)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--size", type=int, default=112, help="image height and width")
    p.add_argument("--repeat", type=int, default=3, help="timed steps per setting")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--compile", choices=("off", "on", "only"), default="off")
    p.add_argument("--torch", action="store_true",
                   help="also PyTorch's step in the same round-robin (its threads: --threads)")
    args = p.parse_args(argv)
    if args.threads:
        cn.blas.set_num_threads(args.threads)
    print(cn.info())
    for name in args.models:
        model, hw = MODELS[name], (args.size, args.size)
        steps = _ours_steps(model, args.batch, hw, args.compile)
        if args.torch:
            import torch

            if args.threads:
                torch.set_num_threads(args.threads)
            steps["torch"] = _torch_step(model, "cpu", args.batch, hw, Options())
        times: dict[str, list[float]] = {k: [] for k in steps}
        for rnd in range(args.repeat + 1):  # round 0: warm-up (graph building, the trace)
            for key, step in steps.items():
                with cn.ops.disabled(*SETTINGS.get(key.split("+")[0], ())):
                    start = time.perf_counter()
                    step()
                    if rnd:
                        times[key].append((time.perf_counter() - start) * 1e3)
        ms = {k: statistics.median(t) for k, t in times.items()}
        print(f"{name} (batch {args.batch}, {args.size}x{args.size}): "
              + ", ".join(f"{k} {v:.0f} ms" for k, v in ms.items()), flush=True)
        for key in (k for k in ms if k.startswith("mlx")):
            ours = key.replace("mlx", "ours")
            print(f"  {ours} / {key}: {ms[ours] / ms[key]:.2f}")
            if "torch" in ms:
                print(f"  {ours} / torch: {ms[ours] / ms['torch']:.2f}, "
                      f"{key} / torch: {ms[key] / ms['torch']:.2f}")
    return 0


def _ours_steps(model: BenchModel, batch: int, hw: tuple[int, int],
                compile_mode: str) -> dict[str, Callable[[], None]]:
    """``{setting[+mx.compile]: step}``, each running one SGD step of one model and waiting;
    a compiled step per setting (``mx.compile`` traces the paths on at its first call)."""
    from functools import partial

    import candle_nn as cn
    import mlx.core as mx

    net = model.build_ours(cn.VarBuilder.from_varmap(cn.VarMap(), seed=0, device="cpu"))
    opt, step_fn, (x, y) = _sgd_step(model, net, batch, hw, 0)

    def run(fn: Callable) -> Callable[[], None]:
        return lambda: mx.eval(fn(x, y), net.state, opt.state)

    state = [net.state, opt.state]
    steps = {}
    for setting in SETTINGS:
        if compile_mode != "only":
            steps[setting] = run(step_fn)
        if compile_mode != "off":
            steps[f"{setting}+mx.compile"] = run(partial(mx.compile, inputs=state,
                                                         outputs=state)(lambda x, y: step_fn(x, y)))
    return steps


def _sgd_step(model: BenchModel, net, batch: int, hw: tuple[int, int], seed: int):
    """``(optimizer, step(x, y) -> loss, (x, y))``: one SGD step (``SGD``'s settings) of ``net``
    in train mode on a seeded batch of ``model``'s inputs and labels."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    net.train()
    opt = optim.SGD(learning_rate=SGD["lr"], momentum=SGD["momentum"],
                    weight_decay=SGD["weight_decay"])
    x_np, y_np = _labels(model, batch, hw, seed)
    value_and_grad = nn.value_and_grad(net, _loss(model))

    def step_fn(x, y):
        loss, grads = value_and_grad(net, x, y)
        opt.update(net, grads)
        return loss

    return opt, step_fn, (mx.array(x_np), mx.array(y_np))


if __name__ == "__main__":
    raise SystemExit(main())
