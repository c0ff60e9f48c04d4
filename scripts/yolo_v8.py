"""``candle-yolo-v8``: detect objects, people's poses or object masks with YOLOv8 or YOLO11 and
draw them, or classify images.

    candle-yolo-v8 --image bike.jpg [DIR 'photos/*.jpg' - ...] [--recursive] [--strict]
                   | --video clip.mp4 [--video FRAMES_DIR ...] [--batch-size 8]
                   [--task detect|pose|segment|classify] [--variant n|s|m|l|x] [--weights FILE]
                   [--conf 0.25] [--retina-masks] [--top-k 5]
                   [--iou 0.7] [--size 640] [--square] [--device cpu] [--out DIR] [--exist-ok]
                   [--max-pixels N] [--json]
                   [--classes N ...] [--max-det 300] [--agnostic-nms] [--half]
                   [--save-txt [--save-conf]] [--save-crop]
                   [--line-width PX] [--hide-labels] [--hide-conf]

For each image, writes ``<stem>_detect<ext>`` (or ``_pose``) into the run folder (``--out``,
default ``runs/detect/predict`` or ``runs/pose/predict``; a fresh ``predict2``, ``predict3``, … when
it is taken, unless ``--exist-ok``; see ``scripts/outputs.py`` and ``docs/outputs.md``): boxes
with class names and scores, and skeletons for pose. ``<stem>`` is the image's own, numbered
(``x-2``) when another input of the run has it. Prints the detections (``--json``: one JSON document
on stdout). Without ``--weights`` the default is candle's published ``yolov8{variant}[-pose]``
checkpoint (variant ``n``); with ``--weights`` the version (YOLOv8 or YOLO11, converted from
ultralytics' ``.pt``: docs/yolo11.md), variant, task and class count are read from the file, and a
``--variant``/``--task`` that disagrees is an error. Class names come from the file's
``candle_nn.names`` metadata when present, else COCO's.

ultralytics' ``yolo predict`` options keep their meanings: ``--classes`` keeps only those class ids,
``--max-det`` caps detections per image, ``--agnostic-nms`` lets boxes of different classes
suppress each other, ``--half`` runs in float16. ``--save-txt`` writes ``<out>/labels/<stem>.txt``
in YOLO's label format, one line per detection, ``class cx cy w h`` normalised to [0, 1] by the
image's size (pose: then ``x y visibility`` per keypoint), ``--save-conf`` appending the score; an
image without detections gets no label file. ``--save-crop`` writes each detection's crop (box
enlarged by 2 % + 10 px, as ultralytics) to ``<out>/crops/<class name>/<stem>.jpg``
(``<stem>2.jpg``, ``<stem>3.jpg``, …: the first name not yet taken, for more of one class).
``--line-width``, ``--hide-labels`` and ``--hide-conf`` change the drawing.

``--task segment`` (a converted YOLOv8-seg file) draws each mask semi-transparent under its box;
``--save-txt`` writes ultralytics' segment labels (``class x1 y1 x2 y2 …``, the mask's outline
polygon normalised to [0, 1]); ``--json`` gives each detection a COCO RLE ``segmentation``;
``--retina-masks`` makes the masks at the original image's resolution (ultralytics'
``retina_masks``). ``--task classify`` (a YOLOv8-cls file) prints the ``--top-k`` classes per image
(``scripts/yolo_v8_classify.py``). See ``docs/yolo_v8_tasks.md``.

Images go through the YOLO task API (``candle_nn_models.yolo``: ``load``, ``predict``, whose
options are the ones above); this program writes each ``Result``'s drawing, labels, crops and
record.

``--video`` takes video files and folders of images (image sequences): each gives an annotated MP4
and per-frame JSON lines (see ``scripts/yolo_v8_video.py``); labels and crops are named
``<stem>_<frame>``, as ultralytics does for videos.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from candle_nn import CandleNNError, Device

from candle_nn_models.yolo import YOLO, Result
from candle_nn_models.yolo.draw import draw_detections
from candle_nn_models.yolo_v8 import MULTIPLES
from candle_nn_models.yolo_v8_masks import InstanceMasks
from candle_nn_models.yolo_v8_post import Detection, crop_box, segment_label_lines, yolo_label_lines
from candle_nn_models.scripts.image_loop import Batch
from candle_nn.cli import ArgumentParser, print_json_document, printable
from candle_nn_models.scripts.common import (add_device_argument, add_input_arguments,
                                             add_output_arguments, compile_choice, parse_device,
                                             positive, run_main, shown)
from candle_nn_models.scripts.outputs import OutputFolder, fit_name
from candle_nn_models.scripts.yolo_v8_classify import classify_images
from candle_nn_models.scripts.yolo_v8_predict import add_predict_arguments, predict_options
from candle_nn_models.scripts.yolo_v8_video import check_sources, detect_video, print_video_result
from candle_nn_models.scripts.yolo_v8_weights import load_detector, load_yolo  # noqa: F401

SAVE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}  # others are written as PNG


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="candle-yolo-v8",
        description="Detect objects (human poses, object masks) with YOLOv8 and write annotated "
                    "images, or classify images with YOLOv8-cls.",
        epilog="candle-yolo-v8 val --data data.yaml: P, R and mAP on a labelled data set "
               "(see candle-yolo-v8 val --help); candle-yolo-v8 train --data data.yaml: "
               "fine-tune on it (candle-yolo-v8 train --help)")
    add_input_arguments(parser, what="detections", required=False)
    parser.add_argument("--video", action="append", metavar="PATH",
                        help="a video file, or a folder of images read as a sequence (repeatable);"
                             " writes an annotated MP4 and per-frame JSON lines")
    parser.add_argument("--batch-size", type=positive(int), default=8,
                        help="--video: frames per forward pass (default 8)")
    parser.add_argument("--task", choices=TASKS, default=None,
                        help="detect (boxes), pose (boxes + keypoints), segment (boxes + masks) "
                             "or classify (top-k classes); default: what --weights holds, else "
                             "detect")
    parser.add_argument("--variant", choices=tuple(MULTIPLES), default=None,
                        help="model size; default: what --weights holds, else n")
    parser.add_argument("--weights", default=None,
                        help="YOLOv8 (candle's layout) or YOLO11 safetensors file, e.g. "
                             "converted by candle-nn-weights convert --from ultralytics (default: "
                             "candle's yolov8{variant}[-pose].safetensors from the Hugging Face "
                             "hub)")
    add_predict_arguments(parser, "main")  # --conf, --iou, --size, --square, --top-k
    add_device_argument(parser)
    add_output_arguments(parser, "runs/<task>/predict, e.g. runs/detect/predict")
    yolo = parser.add_argument_group("ultralytics-style options (same meanings as yolo predict)")
    add_predict_arguments(yolo, "ultralytics")  # --classes, --max-det, --agnostic-nms, ...
    for flag, text in ULTRALYTICS_SWITCHES.items():
        yolo.add_argument(flag, action="store_true", help=text)
    yolo.add_argument("--line-width", type=positive(int), default=None, metavar="PX",
                      help="box line width in pixels (default: scaled to the image)")
    return parser


TASKS = ("detect", "pose", "segment", "classify")

# yolo predict's on/off options of the output files and drawing: flag -> help (those of the
# prediction itself are PredictOptions')
ULTRALYTICS_SWITCHES = {
    "--save-txt": "write YOLO labels, class cx cy w h (normalised), to OUT/labels/",
    "--save-conf": "with --save-txt: append each detection's score",
    "--save-crop": "write each detection's crop to OUT/crops/<class name>/",
    "--hide-labels": "draw boxes without labels",
    "--hide-conf": "labels without scores",
}


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors argparse cannot see on its own (exit status 2, like argparse's)."""
    if bool(args.image) == bool(args.video):
        parser.error("pass images with --image or videos with --video (one of them)")
    if args.save_conf and not args.save_txt:
        parser.error("--save-conf only applies to --save-txt's labels: add --save-txt")
    if args.video and args.task == "classify":
        parser.error("--video runs detect, pose and segment models; classify images with --image")


def load_for(args: argparse.Namespace, device: Device) -> YOLO:
    """:func:`load_yolo` with the command line's weights, task, variant and ``--half``; the
    predict options checked against the model (``--classes`` against its class count);
    ``--compile`` applied."""
    model = load_yolo(args.weights, args.task, args.variant, device,
                      "float16" if args.half else "float32")
    spec, path = model.spec, model.path
    if spec.task == "classify":
        if args.video:
            raise CandleNNError(f"{path} holds {spec}, a classifier: --video runs detect, pose "
                                "and segment models; classify images with --image")
        if args.save_crop:
            raise CandleNNError(f"{path} holds {spec}, a classifier: --save-crop needs "
                                "detections (a detect, pose or segment model)")
    model.options(**predict_options(args))
    model.model.set_compiled(compile_choice(args.compile))
    return model


def output_name(stem: str, image: Path, task: str) -> str:
    """``<stem>_<task><ext>``: ``stem`` claimed for ``image`` in the run folder, the image's own
    suffix when Pillow writes it, else ``.png``."""
    suffix = image.suffix.lower() if image.suffix.lower() in SAVE_SUFFIXES else ".png"
    return f"{stem}_{task}{suffix}"


def run_folder(args: argparse.Namespace, task: str) -> str:
    """``--out``, or ultralytics' default ``runs/<task>/predict``."""
    return args.out if args.out is not None else f"runs/{task}/predict"


def detect(args: argparse.Namespace, batch: Batch) -> None:
    """Run the CLI's work for parsed ``args``: each image's results (``model.predict``) into
    ``batch``, its drawing, labels and crops into the run folder."""
    paths = batch.start()
    if not paths:
        return
    device = parse_device(args.device, args.verbose)
    model = load_for(args, device)
    batch.doc.update({"model": str(model.spec), "task": model.task})
    options = predict_options(args)
    if model.task == "classify":
        classify_images(args, batch, paths, model, options)
        return
    # after the weights: a failed load makes no folder
    output = batch.output = OutputFolder(run_folder(args, model.task), args.exist_ok)
    for image in batch.progress(paths):
        with batch.image(image):
            (result,) = model.predict(image, **options)
            drawing = draw_detections(result.orig_img, result.detections, result.names,
                                      result.skeleton, line_width=args.line_width,
                                      labels=not args.hide_labels, scores=not args.hide_conf)
            stem = output.claim_stem(image)
            out = output.save_image(drawing, output_name(stem, image, model.task), image)
            save_labels_and_crops(args, output, stem, result.orig_img, result.detections,
                                  result.names, image, result.masks)
            batch.done(result.to_json(output=out), _result_lines(result, out))


def save_labels_and_crops(args: argparse.Namespace, output: OutputFolder, stem: str, rgb,
                          detections: Sequence[Detection], names: Sequence[str],
                          source: Path, masks: InstanceMasks | None = None) -> None:
    """``--save-txt``: ``<out>/labels/<stem>.txt`` (none without detections; segmentation:
    polygons of ``masks``); ``--save-crop``: ``<out>/crops/<class name>/<stem>[N].jpg`` (see the
    module docstring); for input ``source``."""
    from PIL import Image

    hw = rgb.shape[:2]
    if args.save_txt and detections:
        if masks is not None:
            lines = segment_label_lines(detections, masks.segments(), save_conf=args.save_conf)
        else:
            lines = yolo_label_lines(detections, hw, save_conf=args.save_conf)
        if lines:
            output.save_text("".join(f"{line}\n" for line in lines), f"labels/{stem}.txt",
                             source)
    if args.save_crop:
        for det in detections:
            x1, y1, x2, y2 = crop_box(det.box_xyxy, hw)
            if x2 <= x1 or y2 <= y1:
                continue  # nothing left after clipping
            name = output.next_free(f"crops/{_safe_name(names[det.class_id])}", stem, ".jpg")
            output.save_image(Image.fromarray(rgb[y1:y2, x1:x2]), name, source)


def _safe_name(name: str) -> str:
    """A class name usable as one folder name."""
    return fit_name(name.replace("/", "_").replace("\\", "_").strip(". ")) or "unnamed"


def _result_lines(result: Result, output: Path) -> list[str]:
    h, w = result.orig_shape
    count = len(result.detections)
    plural = "s" if count != 1 else ""
    lines = [f"{shown(result.path)}: {w}x{h}, {count} detection{plural} -> {shown(output)}"]
    for det in result.detections:
        box = ", ".join(f"{v:.1f}" for v in det.box_xyxy)
        lines.append(f"  {printable(result.names[det.class_id]):<15} {det.score:.3f}  [{box}]")
    return lines


def detect_videos(args: argparse.Namespace) -> list:
    """``--video``: each source through the model frame by frame (``scripts/yolo_v8_video.py``)."""
    sources = check_sources(args.video)
    device = parse_device(args.device, args.verbose)
    yolo = load_for(args, device)
    spec = yolo.spec
    extras = OutputFolder(run_folder(args, spec.task), args.exist_ok)  # videos commit their own
    out_dir = extras.create()

    def annotate(result: Result):
        return result.plot(line_width=args.line_width, labels=not args.hide_labels,
                           conf=not args.hide_conf)

    results = []
    for source in sources:
        stem = extras.claim_stem(source)
        output = out_dir / f"{stem}_{spec.task}.mp4"

        def save_extras(index, result, stem=stem, source=source):
            save_labels_and_crops(args, extras, f"{stem}_{index}", result.orig_img,
                                  result.detections, result.names, source, result.masks)

        try:
            for written in (output, output.with_suffix(".jsonl")):
                extras.check_replaceable(written)
            result = detect_video(yolo, predict_options(args), source, output,
                                  args.batch_size, annotate, save_extras)
        except BaseException:
            extras.abort()
            raise
        extras.commit()  # this video's labels and crops, with its MP4 and JSON lines
        extras.record([result.output, result.jsonl], source)
        results.append(result)
        if not args.json:
            print_video_result(result)
    extras.finish()
    if args.json:
        print_json_document({"model": str(spec), "task": spec.task,
                             "videos": [r.to_dict() for r in results]})
    return results


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_options(parser, args)
    if args.video:
        detect_videos(args)
        return 0
    with Batch(args) as batch:
        detect(args, batch)
    return batch.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``candle-yolo-v8`` (``val``: scripts/yolo_v8_val.py, ``train``:
    scripts/yolo_v8_train.py)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["val"]:
        from candle_nn_models.scripts.yolo_v8_val import main as val

        return val(argv[1:])
    if argv[:1] == ["train"]:
        from candle_nn_models.scripts.yolo_v8_train import main as train

        return train(argv[1:])
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
