"""``candle-yolo-v8 --video``: short videos generated here with PyAV (frames in = frames out,
annotated, JSON line per frame), a video with a corrupt packet, image sequences with a corrupt
image, labels per frame, and the usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest
from conftest import fixture_dir
from PIL import Image

import candle_nn_models.scripts.yolo_v8 as cli

FRAMES, W, H = 12, 200, 138


def _frames() -> list[np.ndarray]:
    bike = Image.open(fixture_dir("images") / "bike.jpg").convert("RGB").resize((W, 139))
    base = np.asarray(bike)[:H]
    return [np.ascontiguousarray(np.roll(base, 5 * i, axis=1)) for i in range(FRAMES)]


def make_video(path: Path, codec: str = "libx264") -> list[np.ndarray]:
    frames = _frames()
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=10)
        stream.width, stream.height = W, H
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return frames


def decode(path: Path) -> tuple[list[np.ndarray], float]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return ([f.to_ndarray(format="rgb24") for f in container.decode(stream)],
                float(stream.average_rate))


@pytest.fixture(scope="module")
def weights() -> Path:
    return fixture_dir("yolov8n") / "weights.safetensors"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_video_frames_in_equal_frames_out_annotated(capsys, weights, tmp_path) -> None:
    source = make_video(tmp_path / "clip.mp4")
    out = tmp_path / "out"
    code, stdout, err = run(capsys, "--video", tmp_path / "clip.mp4", "--weights", weights,
                            "--out", out, "--size", 224, "--batch-size", 5, "--json")
    assert code == 0 and err == ""
    (doc,) = json.loads(stdout)["videos"]
    assert doc["frames"] == FRAMES and doc["skipped"] == 0 and doc["fps"] == 10
    assert (doc["width"], doc["height"]) == (W, H) and doc["detections"] > 0
    written, fps = decode(out / "clip_detect.mp4")
    assert len(written) == FRAMES and fps == 10 and written[0].shape == (H, W, 3)
    lines = [json.loads(line) for line in (out / "clip_detect.jsonl").read_text().splitlines()]
    assert [line["frame"] for line in lines] == list(range(FRAMES))
    assert lines[3]["time"] == pytest.approx(0.3)
    # annotated: boxes change the frames far beyond two H.264 passes' error (--conf 1: none)
    run(capsys, "--video", tmp_path / "clip.mp4", "--weights", weights, "--out",
        tmp_path / "raw", "--size", 224, "--conf", 1)
    plain, _ = decode(tmp_path / "raw" / "clip_detect.mp4")
    for i in (0, FRAMES - 1):
        assert lines[i]["detections"]
        noise = np.abs(plain[i].astype(int) - source[i]).mean()
        drawn = np.abs(written[i].astype(int) - source[i]).mean()
        assert noise < 10 and drawn > 3 * noise, (noise, drawn)  # measured 5.4 vs 75.6


def test_batching_does_not_change_the_detections(capsys, weights, tmp_path) -> None:
    """Frames grouped into batches give each frame its own detections. On the CPU, whose
    kernels compute each image alike at any batch size: on a GPU the conv algorithms differ by
    batch size, which flips near-tie classes of the random fixture weights (H100: 1 in ~100)."""
    make_video(tmp_path / "clip.mp4")
    docs = []
    for batch in (1, 12):
        run(capsys, "--video", tmp_path / "clip.mp4", "--weights", weights, "--out",
            tmp_path / str(batch), "--size", 224, "--batch-size", batch, "--device", "cpu")
        docs.append([json.loads(line)["detections"] for line in
                     (tmp_path / str(batch) / "clip_detect.jsonl").read_text().splitlines()])
    for one, many in zip(*docs):
        assert [d["class_id"] for d in one] == [d["class_id"] for d in many]
        np.testing.assert_allclose([d["box_xyxy"] for d in one], [d["box_xyxy"] for d in many],
                                   atol=0.05)


def test_corrupt_packet_is_skipped_and_counted(capsys, weights, tmp_path) -> None:
    path = tmp_path / "mjpeg.mkv"
    make_video(path, "mjpeg")
    data = bytearray(path.read_bytes())
    starts = [i for i in range(len(data) - 2) if data[i:i + 3] == b"\xff\xd8\xff"]
    assert len(starts) == FRAMES  # one JPEG per packet
    begin, end = starts[4], starts[5] - 200
    data[begin:end] = (b"\xff\xd8\xff\xc0\x00\x02" * (end - begin))[:end - begin]  # frame 4
    path.write_bytes(bytes(data))
    code, stdout, err = run(capsys, "--video", path, "--weights", weights, "--out",
                            tmp_path / "out", "--size", 224)
    assert code == 0 and err == ""
    assert f"{FRAMES - 1} frames (1 skipped)" in stdout
    written, _ = decode(tmp_path / "out" / "mjpeg_detect.mp4")
    assert len(written) == FRAMES - 1
    lines = [json.loads(line) for line in
             (tmp_path / "out" / "mjpeg_detect.jsonl").read_text().splitlines()]
    assert len(lines) == FRAMES and "undecodable" in lines[4]["skipped"]
    assert all("detections" in line for i, line in enumerate(lines) if i != 4)


def test_image_sequence_folder_with_a_corrupt_image(capsys, weights, tmp_path) -> None:
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, frame in enumerate(_frames()[:4]):
        Image.fromarray(frame).save(folder / f"{i:04d}.png")
    (folder / "0002.png").write_bytes(b"not a png")
    code, stdout, err = run(capsys, "--video", folder, "--weights", weights, "--out",
                            tmp_path / "out", "--size", 224, "--save-txt")
    assert code == 0 and err == ""
    assert "3 frames (1 skipped)" in stdout and "@ 25 fps" in stdout
    written, fps = decode(tmp_path / "out" / "frames_detect.mp4")
    assert len(written) == 3 and fps == 25
    labels = sorted(p.name for p in (tmp_path / "out" / "labels").iterdir())
    assert labels == ["frames_0.txt", "frames_1.txt", "frames_3.txt"]  # ultralytics: stem_frame


def test_video_errors(capsys, weights, tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "broken.mp4").write_bytes(b"\x00" * 100)
    cases = [(tmp_path / "missing.mp4", "video not found"),
             (tmp_path / "notes.txt", "is not a video"),
             (tmp_path / "broken.mp4", "is not a readable video")]
    for path, message in cases:
        code, stdout, err = run(capsys, "--video", path, "--weights", weights, "--out",
                                tmp_path / "out")
        assert code == 1 and stdout == "" and err.count("\n") == 1 and message in err, err
    out = tmp_path / "out"
    assert not out.exists() or list(out.iterdir()) == []  # no video, no JSON lines, no temp file
    for argv in ([], ["--image", fixture_dir("images") / "bike.jpg", "--video",
                      tmp_path / "broken.mp4"]):
        with pytest.raises(SystemExit) as exc:
            cli.main([str(a) for a in ["--weights", weights, *argv]])
        assert exc.value.code == 2
    assert "one of them" in capsys.readouterr().err
    (tmp_path / "seq").mkdir()
    Image.fromarray(_frames()[0]).save(tmp_path / "seq" / "0.png")
    code, _, err = run(capsys, "--video", tmp_path / "seq", "--weights", weights, "--classes", 80)
    assert code == 1 and err == "error: --classes 80: the model has 80 classes (0..79)\n"


def test_ctrl_c_mid_video_leaves_no_staged_file(weights, tmp_path) -> None:
    """SIGINT while the annotated video and its JSON lines are being written: the CLI exits
    from its signal thread (no unwinding), which must first remove both staging files."""
    import signal
    import subprocess
    import time

    from helpers.cli import cli_command, cli_env

    frames = _frames()
    with av.open(str(tmp_path / "long.mp4"), "w") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        for i in range(400):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frames[i % FRAMES],
                                                                   format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    out = tmp_path / "out"
    proc = subprocess.Popen(cli_command("yolo", "--video", tmp_path / "long.mp4", "--weights",
                                        weights, "--out", out, "--size", 128),
                            env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (out.is_dir() and len(list(out.glob(".candle-nn-staging-*"))) == 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert [p.name for p in out.iterdir() if p.name.startswith(".candle-nn-staging-")] == []


def test_a_staged_video_removed_before_it_is_opened_stays_removed(tmp_path, monkeypatch) -> None:
    """The race behind a rare leftover of Ctrl-C: the signal thread removes the staged files
    while the main thread is between making the video's staging file and opening it; opening
    must not create it again (av.open(path) did, leaving ``.candle-nn-staging-*.mp4``)."""
    from candle_nn_models.scripts import yolo_v8_video as video

    made = video.temp_beside

    def removed_at_once(path, suffix=None):
        staged = made(path, suffix)
        staged.unlink()  # what the interrupt's watcher thread does
        return staged

    monkeypatch.setattr(video, "temp_beside", removed_at_once)
    with pytest.raises(FileNotFoundError):
        video.VideoWriter(tmp_path / "clip_detect.mp4", (8, 8), 10.0)
    assert list(tmp_path.iterdir()) == []
