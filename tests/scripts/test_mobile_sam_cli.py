"""candle-segment-anything, run in-process: bad prompts fail fast with one error line and no
files; one good run writes the best mask and the overlay."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from conftest import FIXTURES, error_line, load_fixture, one_error_line
from candle_nn_models.scripts.run_manifest import MANIFEST
from candle_nn_models.scripts.segment_anything import PromptError, main, parse_prompts

IMAGE = str(FIXTURES / "images" / "bike.jpg")  # 800x556, the fixture's raw_rgb
WEIGHTS = str(FIXTURES / "mobile_sam" / "weights.safetensors")


def run(capsys, *args: str) -> tuple[int, str, str]:
    """The CLI on the fixture image and weights, on the default device (the GPU when present)."""
    code = main(["--image", IMAGE, "--weights", WEIGHTS, *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args,message", [
    ([], "no prompt"),
    (["--point", "900,10"], "outside the image"),
    (["--point=-5,10"], "outside the image"),
    (["--neg-point", "10,600"], "outside the image"),
    (["--box", "10,10,810,200"], "outside the image"),
    (["--point", "a,2"], "not a number"),
    (["--point", "1,2,3"], "expected 2"),
    (["--point", "nan,0.5"], "not a finite number"),
    (["--point", ""], "expected 2"),
    (["--box", "1,2,3"], "expected 4"),
    (["--box", "300,100,200,400"], "x1 < x2"),
    (["--box", "100,400,300,100"], "y1 < y2"),
])
def test_bad_prompt_is_one_error_line_and_no_files(capsys, tmp_path, args, message):
    out_dir = tmp_path / "out"
    code, out, err = run(capsys, "--out", str(out_dir), *args)
    assert code == 1
    error_line(err, message)
    assert not out_dir.exists()


def test_missing_image_and_weights(capsys, tmp_path):
    code = main(["--image", str(tmp_path / "nope.jpg"), "--point", "0.5,0.5"])
    assert code == 1
    one_error_line(capsys, "nope.jpg")
    code, _, err = run(capsys, "--point", "0.5,0.5", "--weights", str(tmp_path / "w.safetensors"),
                       "--out", str(tmp_path / "out"))
    assert code == 1
    error_line(err, "w.safetensors")
    assert not (tmp_path / "out").exists()


def test_weights_of_another_model(capsys, tmp_path):
    """MobileSAM weights with --model vit_b: one error line naming the file's encoder."""
    code, _, err = run(capsys, "--point", "0.5,0.5", "--model", "vit_b",
                       "--out", str(tmp_path / "out"))
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("error: the weights hold SAM with the tiny encoder, not vit_b")
    assert "--model tiny" in err
    assert not (tmp_path / "out").exists()


def test_prompt_coordinates():
    """Values in [0, 1] are fractions of width/height, larger ones pixels, per value."""
    p = parse_prompts(["0.5,0.25", "580,240"], ["0,556"], "0.1,10,1,0.5", height=556, width=800)
    assert p.points == [(400.0, 139.0), (580.0, 240.0), (0.0, 556.0)]
    assert p.labels == [1, 1, 0]
    assert p.box == (80.0, 10.0, 800.0, 278.0)
    with pytest.raises(PromptError):
        parse_prompts([], [], None, 556, 800)


@pytest.fixture(scope="module")
def multimask_run(tmp_path_factory):
    """One real run (the encoder once): the fixture's point, three masks, embedding saved."""
    import contextlib
    import io as stdio

    folder = tmp_path_factory.mktemp("multimask")
    io, _, _ = load_fixture("mobile_sam")
    x, y = (int(v) for v in io["input.point_coords"][0])
    out, err = stdio.StringIO(), stdio.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--image", IMAGE, "--weights", WEIGHTS, "--point", f"{x},{y}", "--multimask",
                     "--save-embedding", str(folder / "bike.safetensors"),
                     "--out", str(folder / "out")])
    return code, out.getvalue(), err.getvalue(), folder, (x, y)


def test_good_run_writes_best_mask_and_overlay(multimask_run):
    """The fixture's point in pixels, three masks: the saved mask is the reference's best mask;
    every candidate is saved too."""
    code, out, err, folder, _ = multimask_run
    tmp_path = folder / "out"
    io, _, _ = load_fixture("mobile_sam")
    assert code == 0, err
    assert out.count("iou") == 3 and out.count("<- best") == 1
    files = sorted(p.name for p in tmp_path.iterdir() if p.name != MANIFEST)
    assert files == ["bike_mask.png", "bike_mask_0.png", "bike_mask_1.png", "bike_mask_2.png",
                     "bike_masks.json", "bike_overlay.png"]

    mask = np.asarray(Image.open(tmp_path / "bike_mask.png"))
    assert mask.shape == (556, 800) and set(np.unique(mask)) <= {0, 255}
    best = int(np.argmax(io["output.iou_predictions"][0]))
    reference = io["output.masks"][0, best] > 0
    # Our own PIL resize vs the reference's differs in a few uint8 values: allow edge pixels.
    assert np.mean((mask > 0) != reference) < 1e-3
    with Image.open(tmp_path / "bike_overlay.png") as overlay:
        assert overlay.size == (800, 556) and overlay.mode == "RGB"
    for i in range(3):
        candidate = np.asarray(Image.open(tmp_path / f"bike_mask_{i}.png")) > 0
        assert np.mean(candidate != (io["output.masks"][0, i] > 0)) < 1e-3
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / f"bike_mask_{best}.png")), mask)

    doc = json.loads((tmp_path / "bike_masks.json").read_text())
    assert doc["prompts"] == {"points": [[580.0, 240.0]], "labels": [1], "box": None}
    assert [m["best"] for m in doc["masks"]] == [i == best for i in range(3)]
    for i, record in enumerate(doc["masks"]):
        decoded = coco_decode(record["segmentation"])
        png = np.asarray(Image.open(tmp_path / f"bike_mask_{i}.png")) > 0
        np.testing.assert_array_equal(decoded, png)
        assert record["area"] == decoded.sum()
        ys, xs = np.nonzero(decoded)
        assert record["bbox"] == [xs.min(), ys.min(), xs.max() - xs.min(), ys.max() - ys.min()]
        # From the raw image (our PIL resize, not the fixture's encoder input): measured 1.3e-4.
        np.testing.assert_allclose(record["predicted_iou"], io["output.iou_predictions"][0, i],
                                   atol=1e-3)


def coco_decode(rle: dict) -> np.ndarray:
    from pycocotools import mask as mask_utils

    return mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()}).astype(bool)


def no_encoder(monkeypatch):
    """Sam.load whose image encoder fails if it runs."""
    from candle_nn_models.segment_anything import Sam

    original = Sam.load.__func__

    def load(cls, vb, encoder="tiny"):
        sam = original(cls, vb, encoder)

        def forbidden(x):
            raise AssertionError("the image encoder ran")

        sam.image_encoder.forward = forbidden
        return sam

    monkeypatch.setattr(Sam, "load", classmethod(load))


def test_saved_embedding_gives_the_same_masks_without_the_encoder(capsys, tmp_path, monkeypatch,
                                                                  multimask_run):
    _, _, _, folder, (x, y) = multimask_run
    no_encoder(monkeypatch)
    code, out, err = run(capsys, "--point", f"{x},{y}", "--multimask", "--embedding",
                         str(folder / "bike.safetensors"), "--out", str(tmp_path), "--json")
    assert code == 0, err
    doc = json.loads(out)["images"][0]  # --json: one document on stdout, an entry per image
    assert doc["mode"] == "prompts" and len(doc["masks"]) == 3
    for i in range(3):
        assert (tmp_path / f"bike_mask_{i}.png").read_bytes() == (
            folder / "out" / f"bike_mask_{i}.png").read_bytes()
        np.testing.assert_array_equal(coco_decode(doc["masks"][i]["segmentation"]),
                                      np.asarray(Image.open(tmp_path / f"bike_mask_{i}.png")) > 0)
    # A higher logit threshold gives smaller masks, from the same embedding.
    code, out, err = run(capsys, "--point", f"{x},{y}", "--multimask", "--embedding",
                         str(folder / "bike.safetensors"), "--out", str(tmp_path / "t"),
                         "--json", "--threshold", "2.5")
    tight = json.loads(out)["images"][0]
    assert code == 0 and tight["threshold"] == 2.5
    assert all(t["area"] < m["area"] for t, m in zip(tight["masks"], doc["masks"]))


def test_embedding_of_another_image_or_model_is_refused(capsys, tmp_path, monkeypatch,
                                                        multimask_run):
    _, _, _, folder, _ = multimask_run
    no_encoder(monkeypatch)
    other = tmp_path / "other.png"
    Image.open(IMAGE).resize((400, 278)).save(other)
    embedding = str(folder / "bike.safetensors")
    cases = [
        (["--image", str(other), "--embedding", embedding], "embedding of another image"),
        (["--image", IMAGE, "--embedding", WEIGHTS], "not a SAM image embedding"),
        (["--image", IMAGE, "--embedding", str(tmp_path / "nope.safetensors")], "not found"),
        (["--image", IMAGE, "--embedding", str(folder)], f"embedding file {folder} is a folder"),
        (["--image", IMAGE, "--save-embedding", str(tmp_path / "no" / "e.safetensors")],
         "does not exist"),
        (["--image", IMAGE, "--everything", "--point", "1,1"], "drop --point"),
    ]
    for args, message in cases:
        code = main(["--weights", WEIGHTS, "--point", "0.5,0.5", *args,
                     "--out", str(tmp_path / "out")] if "--everything" not in args else
                    ["--weights", WEIGHTS, *args, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert code == 1 and err.count("\n") == 1 and message in err, (args, err)
        assert not (tmp_path / "out").exists()


def test_everything_writes_overlay_pngs_and_coco_json(capsys, tmp_path, monkeypatch):
    """--everything on a small image with the point-dependent decoder stand-in: a distinct
    colour per mask, one PNG per mask, and JSON whose RLEs decode (pycocotools) to those PNGs;
    the records are the generator's."""
    from helpers.sam_decoder_stand_in import install_on_ours
    from candle_nn_models.segment_anything import Sam, SamAutomaticMaskGenerator

    original = Sam.load.__func__
    models = []

    def load(cls, vb, encoder="tiny"):
        sam = original(cls, vb, encoder)
        install_on_ours(sam)
        models.append(sam)
        return sam

    monkeypatch.setattr(Sam, "load", classmethod(load))
    small = tmp_path / "small.png"
    rgb = np.asarray(Image.open(IMAGE).convert("RGB").resize((160, 111), Image.BILINEAR))
    Image.fromarray(rgb).save(small)
    code = main(["--image", str(small), "--weights", WEIGHTS, "--everything",
                 "--points-per-side", "6", "--out", str(tmp_path / "out"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)["images"][0]
    out_dir = tmp_path / "out"
    assert sorted(p.name for p in out_dir.iterdir() if p.name != MANIFEST) == [
        "small_everything.png", "small_masks", "small_masks.json"]
    assert json.loads((out_dir / "small_masks.json").read_text())["masks"] == doc["masks"]
    assert doc["files"]["json"].endswith("small_masks.json")
    expected = SamAutomaticMaskGenerator(models[0], points_per_side=6,
                                         output_mode="coco_rle").generate(rgb)
    assert doc["masks"] == json.loads(json.dumps(expected)) and len(expected) >= 8
    masks = [coco_decode(r["segmentation"]) for r in doc["masks"]]
    pngs = sorted((out_dir / "small_masks").iterdir(), key=lambda p: int(p.stem))
    assert [p.name for p in pngs] == [f"{i}.png" for i in range(len(masks))]
    for mask, png, record in zip(masks, pngs, doc["masks"]):
        np.testing.assert_array_equal(np.asarray(Image.open(png)) > 0, mask)
        assert mask.sum() == record["area"]
    overlay = np.asarray(Image.open(out_dir / "small_everything.png"))
    assert overlay.shape == rgb.shape
    # Each mask's own pixels (covered by no other mask) share one tint, different per mask.
    tints = set()
    coverage = np.sum(masks, axis=0)
    for mask in masks:
        own = mask & (coverage == 1)
        if own.sum() >= 20:
            colour = np.median(overlay[own].astype(int) - 0.45 * rgb[own], axis=0).round()
            tints.add(tuple(int(c) // 8 for c in colour))
    assert len(tints) >= 0.8 * len(masks)

    # Human output: one line per mask and the files.
    code = main(["--image", str(small), "--weights", WEIGHTS, "--everything",
                 "--points-per-side", "6", "--out", str(tmp_path / "out2")])
    out = capsys.readouterr().out
    assert code == 0 and out.count("\nmask ") == len(masks) and out.count("wrote ") == 3


@pytest.mark.parametrize("encoder", ["vit_b", "vit_l"])
def test_the_encoder_is_read_from_the_weights_without_model(encoder, monkeypatch, tmp_path):
    """Without --model the SAM CLI builds the encoder the file holds (as the other CLIs read
    their variants), instead of MobileSAM's; the file's tensors are stood in by a VarBuilder of
    that checkpoint's shapes (a real ViT-B file is 360 MB)."""
    import candle_nn as cn
    import mlx.core as mx
    from candle_nn_models.scripts import segment_anything as cli
    from candle_nn_models.segment_anything import Sam
    from candle_nn_models.weights.spec import RecordingSource

    source = RecordingSource()
    Sam.load(cn.VarBuilder(source, dtype=mx.float32, device=cn.Device.cpu()), encoder)
    zero = np.zeros((), np.float32)
    shapes = cn.VarBuilder.from_tensors({k: np.broadcast_to(zero, s)
                                         for k, s in source.requested.items()})
    built = []
    from candle_nn_models.sam import build  # where the CLI's load_sam builds the model

    monkeypatch.setattr(build.VarBuilder, "from_safetensors", lambda *a, **k: shapes)
    monkeypatch.setattr(build, "build_model", lambda family, variant, vb: built.append(
        (family, variant)) or "model")
    weights = tmp_path / "sam.safetensors"
    weights.write_bytes(b"stand-in")
    _, _, variant = cli.load_sam(None, str(weights), cn.Device.cpu())
    assert variant == encoder and built == [("sam", encoder)]


class _Terminal:
    """A stand-in stderr that says it is a terminal and keeps what is written to it."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def test_everything_shows_its_progress_on_a_terminal_only(tmp_path, monkeypatch):
    """--everything (about a minute on a CPU) draws a bar of the prompt points decoded on a
    terminal's stderr, ending at all of them; with --json, or when stderr is not a terminal,
    nothing but the one summary line is written there. Decoder stand-in: a fast run."""
    import sys

    from helpers.sam_decoder_stand_in import install_on_ours
    from candle_nn_models.segment_anything import Sam

    original = Sam.load.__func__

    def load(cls, vb, encoder="tiny"):
        sam = original(cls, vb, encoder)
        install_on_ours(sam)
        return sam

    monkeypatch.setattr(Sam, "load", classmethod(load))
    small = tmp_path / "small.png"
    Image.open(IMAGE).convert("RGB").resize((160, 111)).save(small)
    args = ["--image", str(small), "--weights", WEIGHTS, "--everything", "--points-per-side",
            "6", "--points-per-batch", "8", "--device", "cpu"]
    for extra, shown in (([], True), (["--json"], False)):
        terminal = _Terminal()
        saved, sys.stderr = sys.stderr, terminal
        try:
            code = main([*args, *extra, "--out", str(tmp_path / f"out{len(extra)}")])
        finally:
            sys.stderr = saved
        assert code == 0, terminal.text
        assert ("36/36" in terminal.text and "point" in terminal.text) == shown, terminal.text
        assert ("8/36" in terminal.text) == shown, terminal.text  # a step after the first batch
