"""candle-segment-anything, run in-process: bad prompts fail fast with one error line and no
files; one good run writes the best mask and the overlay."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from conftest import FIXTURES, load_fixture
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
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert not out_dir.exists()


def test_missing_image_and_weights(capsys, tmp_path):
    code = main(["--image", str(tmp_path / "nope.jpg"), "--point", "0.5,0.5"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: ") and "nope.jpg" in err
    code, _, err = run(capsys, "--point", "0.5,0.5", "--weights", str(tmp_path / "w.safetensors"),
                       "--out", str(tmp_path / "out"))
    assert code == 1 and err.count("\n") == 1 and "w.safetensors" in err
    assert not (tmp_path / "out").exists()


def test_weights_of_another_model(capsys, tmp_path):
    """MobileSAM weights with --model vit_b: one error line naming the missing tensor."""
    code, _, err = run(capsys, "--point", "0.5,0.5", "--model", "vit_b",
                       "--out", str(tmp_path / "out"))
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("error: tensor 'image_encoder.patch_embed.proj.weight' not found")
    assert not (tmp_path / "out").exists()


def test_prompt_coordinates():
    """Values in [0, 1] are fractions of width/height, larger ones pixels, per value."""
    p = parse_prompts(["0.5,0.25", "580,240"], ["0,556"], "0.1,10,1,0.5", height=556, width=800)
    assert p.points == [(400.0, 139.0), (580.0, 240.0), (0.0, 556.0)]
    assert p.labels == [1, 1, 0]
    assert p.box == (80.0, 10.0, 800.0, 278.0)
    with pytest.raises(PromptError):
        parse_prompts([], [], None, 556, 800)


def test_good_run_writes_best_mask_and_overlay(capsys, tmp_path):
    """The fixture's point in pixels, three masks: the saved mask is the reference's best mask."""
    io, _, _ = load_fixture("mobile_sam")
    x, y = (int(v) for v in io["input.point_coords"][0])
    code, out, err = run(capsys, "--point", f"{x},{y}", "--multimask", "--out", str(tmp_path))
    assert code == 0, err
    assert out.count("iou") == 3 and out.count("<- best") == 1
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["bike_mask.png", "bike_overlay.png"]

    mask = np.asarray(Image.open(tmp_path / "bike_mask.png"))
    assert mask.shape == (556, 800) and set(np.unique(mask)) <= {0, 255}
    best = int(np.argmax(io["output.iou_predictions"][0]))
    reference = io["output.masks"][0, best] > 0
    # Our own PIL resize vs the reference's differs in a few uint8 values: allow edge pixels.
    assert np.mean((mask > 0) != reference) < 1e-3
    with Image.open(tmp_path / "bike_overlay.png") as overlay:
        assert overlay.size == (800, 556) and overlay.mode == "RGB"
