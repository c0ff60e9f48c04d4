"""``candle-nn-bench``'s ``mobilesam-amg`` entry: automatic mask generation, end to end.

One call is one image through the whole generator — the TinyViT encoder once, the grid of point
prompts through the prompt encoder and mask decoder ``points_per_batch`` at a time (each
generator's default: MobileSAM's 64; ours 64 on the CPU, 256 on a GPU), then the
predicted-IoU and stability filters, box NMS and RLE encoding — with MobileSAM's defaults and
``--amg-points`` points a side (32: MobileSAM's default, 1024 prompts). Ours is
:class:`~candle_nn_models.segment_anything.SamAutomaticMaskGenerator`; the peer is MobileSAM's own
``SamAutomaticMaskGenerator`` (PyPI ``mobilesam-mirror``) in PyTorch, on the same weights file
(:mod:`benchmarks.mobile_sam_reference` loads it). Each row also says how many masks its side
returned: with the fixture's random weights nearly every prompt gives the same few masks, so the
counts are small and alike on both sides — fine for timing (the work per prompt does not depend on
the values), but no measure of segmentation quality.

The image is the fixtures' ``images/bike.jpg`` (800x556), else a seeded photo-like image of that
size. A pipeline is timed at batch 1 only (:func:`~benchmarks.bench_timing.time_pipeline`): every
call timed, ``--repeat`` calls at most, stopping once ``budget_s`` has passed; the first, cold call
is reported apart (``first s``) and the median is over the later ones (on a GPU the cold call is
mostly kernel compilation: 29 s vs 0.5 s on the H100). No ``mx.compile`` / ``torch.compile`` /
ONNX rows: the generator is model calls plus host-side NumPy, not one graph. float32 only.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from benchmarks.bench_models import BenchModel
from benchmarks.bench_timing import Options, result, time_pipeline

IMAGE = ("images", "bike.jpg")  # its (H, W) is the model's input_hw


def image(model: BenchModel, seed: int = 0) -> np.ndarray:
    """The benchmark image, ``(H, W, 3)`` uint8 RGB."""
    from benchmarks.ours import fixtures

    path = fixtures().joinpath(*IMAGE)
    from PIL import Image, ImageOps

    if path.is_file():
        with Image.open(path) as img:
            return np.asarray(ImageOps.exif_transpose(img).convert("RGB"))
    # Smooth colour regions with some texture: a few large blobs, not white noise.
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (6, 9, 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize(model.input_hw[::-1], Image.BICUBIC), dtype=np.float32)
    noise = rng.normal(0.0, 6.0, smooth.shape)
    return np.clip(smooth + noise, 0, 255).astype(np.uint8)


def _settings(opts: Options) -> dict:
    """Each generator's defaults but the grid (MobileSAM's: thresholds 0.88 / 0.95, NMS 0.7)."""
    return {"points_per_side": opts.amg_points}


def _weights(model: BenchModel, cache_dir: str) -> tuple[str, str] | None:
    """The weights file ours loaded: the fixture's, else the seeded one ours wrote to the cache
    (the PyTorch worker must not import candle_nn to make it)."""
    from benchmarks.ours import fixtures

    fixture = fixtures() / model.fixture / "weights.safetensors"
    if fixture.is_file():
        return str(fixture), f"fixture {model.fixture} (float16 on disk)"
    seeded = Path(cache_dir) / f"{model.name}.safetensors"
    return (str(seeded), "seeded VarMap (float32 on disk)") if seeded.is_file() else None


def _run(impl: str, model: BenchModel, device: str, generate: Callable[[np.ndarray], list],
         load_s: float, opts: Options, version: str, note: str) -> dict:
    picture = image(model, opts.seed)
    counts: list[int] = []

    def call() -> None:
        counts.append(len(generate(picture)))

    timings = time_pipeline(call, opts)
    if len(set(counts)) != 1:
        raise RuntimeError(f"the generator returned {sorted(set(counts))} masks on the same image")
    return result(impl, model, device, "float32", load_s=load_s, version=version,
                  note=f"{note}; {opts.amg_points}x{opts.amg_points} points, image "
                       f"{picture.shape[1]}x{picture.shape[0]}", output=f"{counts[0]} masks",
                  masks=counts[0], **timings)


def run_ours(model: BenchModel, device: str, dtype: str, opts: Options, cache_dir: str) -> dict:
    """Our generator on ``device`` (float32)."""
    from benchmarks.ours import OURS, load_ours, prepare_ours

    reason = prepare_ours(device, opts)
    if reason:
        return result(OURS, model, device, dtype, status="unavailable", reason=reason)
    import candle_nn as cn
    from candle_nn_models.segment_anything import SamAutomaticMaskGenerator

    sam, load_s, origin = load_ours(model, device, dtype, cache_dir)
    generator = SamAutomaticMaskGenerator(sam, **_settings(opts))
    return _run(OURS, model, device, generator.generate, load_s, opts, cn.__version__,
                f"weights: {origin}")


def run_torch(model: BenchModel, device: str, dtype: str, opts: Options, cache_dir: str) -> dict:
    """MobileSAM's generator in PyTorch on the weights ours loaded (never imports candle_nn)."""
    impl = "torch"
    if dtype != "float32":
        return result(impl, model, device, dtype, status="unavailable",
                      reason="benchmarked in float32 only")
    try:
        import torch
    except ImportError:
        return result(impl, model, device, dtype, status="unavailable",
                      reason="torch not installed (pip install 'candle-nn-mlx[bench]')")
    if model.torch_missing:
        return result(impl, model, device, dtype, status="unavailable",
                      reason=f"reference needs {model.torch_missing}")
    if device != "cpu" and not torch.cuda.is_available():
        return result(impl, model, device, dtype, status="unavailable",
                      reason="this torch has no CUDA")
    weights = _weights(model, cache_dir)
    if weights is None:
        return result(impl, model, device, dtype, status="unavailable",
                      reason="no weights: neither the fixture nor ours' seeded file")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    torch.backends.cuda.matmul.allow_tf32 = opts.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = opts.precision == "tf32"
    from benchmarks.mobile_sam_reference import build_reference_sam, import_mobile_sam

    mobile_sam, stand_ins = import_mobile_sam(stable_nms=False)
    torch_device = "cpu" if device == "cpu" else "cuda:" + (device.split(":") + ["0"])[1]
    start = time.perf_counter()
    sam = build_reference_sam(weights[0], torch_device)
    load_s = time.perf_counter() - start
    generator = mobile_sam.SamAutomaticMaskGenerator(sam, **_settings(opts))

    def generate(picture: np.ndarray) -> Any:
        with torch.inference_mode():
            return generator.generate(picture)  # masks come back on the host: synchronised

    threads = f"{opts.threads or 'default'} threads" if device == "cpu" else "exact float32"
    stand = f", stand-ins for {'+'.join(stand_ins)}" if stand_ins else ""
    return _run(impl, model, device, generate, load_s, opts, torch.__version__,
                f"MobileSAM's generator, {threads}{stand}; weights: {weights[1]}")


# -- --profile -------------------------------------------------------------------------------------
_STAGES = {  # names in automatic_mask_generator's namespace → what the profile calls them
    "calculate_stability_score": "stability score (full-size logits)",
    "batched_mask_to_box": "mask boxes",
    "nms": "box NMS",
    "uncrop_masks": "uncrop masks",
    "mask_to_rle": "RLE encoding",
    "rle_to_mask": "RLE decoding (binary_mask output)",
}


def profile(model: BenchModel, device: str, opts: Options, cache_dir: str) -> str:
    """Where our generator's time goes, one image: the encoder, the point-grid decoder's
    per-image set-up, its token stage (every prompt) and its mask upscaling (the prompts with a
    mask that passes the predicted-IoU filter), upsampling the kept masks, and each
    post-processing step. Every stage's MLX output is evaluated before
    the next starts (as in ``bench_profile``), so lazy work is counted where it is made;
    "other" is the rest (thresholding and host copies of the masks, records)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from benchmarks.ours import load_ours
    from candle_nn_models.segment_anything import SamAutomaticMaskGenerator
    from candle_nn_models.segment_anything import automatic_mask_generator as amg_module
    from candle_nn_models.segment_anything.amg.point_decoder import PointGridDecoder

    sam, _, _ = load_ours(model, device, "float32", cache_dir)
    generator = SamAutomaticMaskGenerator(sam, **_settings(opts))
    picture = image(model, opts.seed)
    SamAutomaticMaskGenerator(sam, points_per_side=2).generate(picture)  # warm: every stage once
    spent: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            mx.eval([a for a in (*args, *kwargs.values()) if isinstance(a, mx.array)])
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            mx.eval([o for _, o in tree_flatten(out) if isinstance(o, mx.array)])
            spent.setdefault(name, []).append(time.perf_counter() - start)
            return out
        return call

    patched = {name: getattr(amg_module, name) for name in _STAGES}
    decoder_stages = {"__init__": "decoder: image side, once per crop",
                      "decode": "decoder: prompt tokens, IoUs (every prompt)",
                      "masks": "decoder: output upscaling (kept prompts)"}
    decoder_methods = {name: getattr(PointGridDecoder, name) for name in decoder_stages}
    predictor = generator.predictor
    try:
        for name, label in _STAGES.items():
            setattr(amg_module, name, timed(label, patched[name]))
        for name, label in decoder_stages.items():
            setattr(PointGridDecoder, name, timed(label, decoder_methods[name]))
        predictor.set_image = timed("image encoder (+ resize, normalise)", predictor.set_image)
        sam.postprocess_masks = timed("upsample kept masks to the image", sam.postprocess_masks)
        start = time.perf_counter()
        masks = len(generator.generate(picture))
        total = time.perf_counter() - start
    finally:
        for name, fn in patched.items():
            setattr(amg_module, name, fn)
        for name, fn in decoder_methods.items():
            setattr(PointGridDecoder, name, fn)
        for obj, attr in ((predictor, "set_image"), (sam, "postprocess_masks")):
            obj.__dict__.pop(attr, None)
    lines = [f"{model.name}: one image {picture.shape[1]}x{picture.shape[0]}, "
             f"{opts.amg_points}x{opts.amg_points} points, {masks} masks: {total:.2f} s",
             f"  {'stage':40s} {'s':>8s} {'share':>6s} {'calls':>6s}"]
    for name, times in sorted(spent.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"  {name:40s} {sum(times):8.2f} {sum(times) / total:6.1%} {len(times):6d}")
    other = total - sum(sum(t) for t in spent.values())
    lines.append(f"  {'other (thresholds, host copies, records)':40s} {other:8.2f} "
                 f"{other / total:6.1%}")
    return "\n".join(lines)
