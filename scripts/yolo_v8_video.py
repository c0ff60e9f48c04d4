"""``candle-yolo-v8 --video``: YOLOv8 on videos and image sequences, frame by frame.

Each source — a video file, or a folder of images read in name order as a sequence — gives an
annotated H.264 MP4 ``<out>/<stem>_<task>.mp4`` (the source's frame rate; 25 fps for image
sequences) and ``<out>/<stem>_<task>.jsonl``, one JSON line per frame: ``{"frame": i,
"time": seconds, "detections": [...]}``, or ``{"frame": i, "skipped": reason}`` for a frame that
could not be decoded. Such frames are skipped and counted, not fatal. Frames go through the YOLO
task API in batches of ``--batch-size`` (``YOLO.predict_batch``: one forward pass each), and
each frame's ``Result`` gives its drawing and its line's ``detections`` (``Result.to_json``).
Both files are written to temporary names and renamed at the end, so a failed run leaves
neither.

Decoding and encoding use PyAV: FFmpeg's libraries in-process (its wheels bundle FFmpeg with
libx264, so nothing else needs installing), packet by packet, so one corrupt packet costs its
frame rather than the stream; imageio-ffmpeg would pipe raw frames from an ``ffmpeg`` subprocess,
where a decode error ends the pipe.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from candle_nn import ImageError
import numpy as np

from candle_nn.atomic_write import remove_quietly, temp_beside
from candle_nn_models.yolo import YOLO, Result
from candle_nn_models.scripts.common import load_rgb
from candle_nn_models.scripts.input_paths import IMAGE_SUFFIXES

VIDEO_SUFFIXES = {".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".mpg", ".mpeg", ".wmv",
                  ".flv", ".ts"}
SEQUENCE_FPS = 25


@dataclass
class VideoResult:
    """What the CLI did with one video or image sequence."""

    source: Path
    output: Path
    jsonl: Path
    frames: int  # decoded and written
    skipped: int  # failed to decode
    detections: int
    size_hw: tuple[int, int]
    fps: float

    def to_dict(self) -> dict:
        return {"video": str(self.source), "output": str(self.output), "jsonl": str(self.jsonl),
                "frames": self.frames, "skipped": self.skipped, "detections": self.detections,
                "height": self.size_hw[0], "width": self.size_hw[1], "fps": self.fps}


def check_sources(specs: Sequence[str]) -> list[Path]:
    """``--video`` values as paths: video files (by suffix) or folders of images."""
    sources = []
    for spec in specs:
        path = Path(spec)
        if path.is_dir():
            if not _sequence_files(path):
                raise ImageError(f"no image files in folder {path} (an image sequence)")
        elif not path.is_file():
            raise ImageError(f"video not found: {path}")
        elif path.suffix.lower() not in VIDEO_SUFFIXES:
            raise ImageError(f"{path} is not a video ({', '.join(sorted(VIDEO_SUFFIXES))}); "
                             "pass images with --image, image sequences as a folder")
        sources.append(path)
    return sources


def _sequence_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


class FrameReader:
    """Frames of a video file or an image folder, in order: ``(H, W, 3)`` uint8 RGB, or a
    string (why) for a frame that failed to decode. ``fps`` and ``total`` (when known)."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self.fps: float = SEQUENCE_FPS
        self.total: int | None = None
        self._container = None
        if source.is_dir():
            self._files = _sequence_files(source)
            self.total = len(self._files)
            return
        import av

        try:
            self._container = av.open(str(source))
            self._stream = self._container.streams.video[0]
        except (av.error.FFmpegError, IndexError) as exc:
            self.close()
            why = "no video stream" if isinstance(exc, IndexError) else str(exc)
            raise ImageError(f"{source} is not a readable video ({why})") from None
        rate = self._stream.average_rate or self._stream.guessed_rate
        self.fps = float(rate) if rate else SEQUENCE_FPS
        self.total = self._stream.frames or None

    def __iter__(self) -> Iterator["np.ndarray | str"]:
        if self._container is None:
            for path in self._files:
                try:
                    yield load_rgb(path)
                except ImageError as exc:
                    yield str(exc)
            return
        import av

        for packet in self._container.demux(self._stream):
            try:
                frames = packet.decode()
            except av.error.FFmpegError as exc:  # one corrupt packet: skip its frame
                when = float(packet.pts or 0) * float(packet.time_base or 0)
                yield f"undecodable packet at {when:.3f} s ({exc})"
                continue
            for frame in frames:
                yield frame.to_ndarray(format="rgb24")

    def close(self) -> None:
        if self._container is not None:
            self._container.close()
            self._container = None


class VideoWriter:
    """H.264 MP4 frames of one size (odd sizes padded by a pixel: yuv420p needs even sides),
    written to a temporary file that :meth:`commit` renames to ``path``."""

    def __init__(self, path: Path, size_hw: tuple[int, int], fps: float) -> None:
        import av

        self.path, self.size_hw = path, size_hw
        self.tmp = temp_beside(path)
        # Opened without O_CREAT: a Ctrl-C whose watcher thread removed the staged file between
        # temp_beside and here must not see it made again (av.open(path) would create it).
        self._file = os.fdopen(os.open(self.tmp, os.O_WRONLY | os.O_TRUNC), "wb")
        self._container = av.open(self._file, "w", format="mp4")
        self._stream = self._container.add_stream(
            "libx264", rate=Fraction(fps).limit_denominator(1001))
        h, w = size_hw
        self._stream.height, self._stream.width = h + h % 2, w + w % 2
        self._stream.pix_fmt = "yuv420p"

    def write(self, rgb: np.ndarray) -> None:
        import av

        h, w = self.size_hw
        if rgb.shape[:2] != (h, w):  # an image sequence of mixed sizes: fit to the first
            from PIL import Image

            rgb = np.asarray(Image.fromarray(rgb).resize((w, h)))
        rgb = np.pad(rgb, [(0, h % 2), (0, w % 2), (0, 0)], mode="edge")
        for packet in self._stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
            self._container.mux(packet)

    def commit(self) -> Path:
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        self._file.close()
        os.replace(self.tmp, self.path)
        return self.path

    def discard(self) -> None:
        try:
            self._container.close()
            self._file.close()
        finally:
            remove_quietly(self.tmp)


def detect_video(model: YOLO, options: dict[str, Any], source: Path, output: Path,
                 batch_size: int, annotate: Callable[[Result], np.ndarray],
                 save_extras: Callable[[int, Result], None]) -> VideoResult:
    """Run ``model`` (``YOLO.predict_batch`` with ``options``) over every frame of ``source``
    in batches of ``batch_size``; write the annotated video ``output`` and its JSON lines
    beside it (both or neither). ``annotate(result)`` draws a frame; ``save_extras(frame index,
    result)`` writes --save-txt/--save-crop outputs."""
    from tqdm import tqdm

    reader = FrameReader(source)
    jsonl = output.with_suffix(".jsonl")
    jsonl_tmp = temp_beside(jsonl)
    writer: VideoWriter | None = None
    counts = {"frames": 0, "skipped": 0, "detections": 0}
    try:
        with open(jsonl_tmp, "w", encoding="utf-8") as lines, \
                tqdm(total=reader.total, unit="frame", desc=source.name, file=sys.stderr,
                     disable=not sys.stderr.isatty(), leave=False) as progress:
            batch: list[tuple[int, np.ndarray]] = []

            def flush() -> None:
                nonlocal writer
                if not batch:
                    return
                found = model.predict_batch([rgb for _, rgb in batch], **options)
                for (index, rgb), result in zip(batch, found):
                    if writer is None:
                        writer = VideoWriter(output, rgb.shape[:2], reader.fps)
                    writer.write(np.asarray(annotate(result)))
                    save_extras(index, result)
                    lines.write(_frame_line(index, index / reader.fps, result))
                    counts["frames"] += 1
                    counts["detections"] += len(result.detections)
                progress.update(len(batch))
                batch.clear()

            for index, frame in enumerate(reader):
                if isinstance(frame, str):
                    flush()  # keep the JSON lines in frame order
                    lines.write(json.dumps({"frame": index, "skipped": frame}) + "\n")
                    counts["skipped"] += 1
                    progress.update(1)
                    continue
                if batch and frame.shape != batch[0][1].shape:
                    flush()  # one batch, one input shape
                batch.append((index, frame))
                if len(batch) == batch_size:
                    flush()
            flush()
        if writer is None:
            raise ImageError(f"{source}: no frame could be decoded "
                             f"({counts['skipped']} skipped)")
        size_hw = writer.size_hw
        writer.commit()
        os.replace(jsonl_tmp, jsonl)
    except BaseException:
        if writer is not None:
            writer.discard()
        raise
    finally:
        reader.close()
        remove_quietly(jsonl_tmp)
    return VideoResult(source, output, jsonl, counts["frames"], counts["skipped"],
                       counts["detections"], size_hw, round(reader.fps, 3))


def _frame_line(index: int, time: float, result: Result) -> str:
    return json.dumps({"frame": index, "time": round(time, 4),
                       "detections": result.to_json()["detections"]}) + "\n"


def print_video_result(result: VideoResult) -> None:
    h, w = result.size_hw
    print(f"{result.source}: {result.frames} frames ({result.skipped} skipped), {w}x{h} @ "
          f"{result.fps:g} fps, {result.detections} detections -> {result.output}, "
          f"{result.jsonl}")

