"""End to end as a user does it: a YOLO11 checkpoint saved the way ultralytics' trainer saves it
(``torch.save`` of ``{"model": None, "ema": <half-precision model>, …}``) → ``candle-nn-weights
convert --from ultralytics`` → ``candle-yolo-v8 --weights`` gives ultralytics' own predictions
(``YOLO(best.pt).predict``) on bike.jpg: the same detections, classes and keypoints, scores within
1e-4 and pixels within 0.1 (1e-4 of the image, plus the JSON's rounding), masks (COCO RLE in the
JSON) within IoU 0.999 of ultralytics' on the original image."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from conftest import fixture_dir, one_error_line
from helpers.ultralytics_reference import import_ultralytics
from helpers.yolo11_reference import bike, seeded_model
import candle_nn_models.scripts.yolo_v8 as yolo_cli
from candle_nn_models.weights.cli import main as weights_cli
from candle_nn_models.weights.metadata import read_metadata

SIZE = 160


def _save_like_ultralytics(model: torch.nn.Module, path, task: str = "detect") -> None:
    """ultralytics' ``BaseTrainer.save_model`` layout (EMA weights in float16, ``model`` None)."""
    torch.save({"epoch": -1, "best_fitness": None, "model": None,
                "ema": copy.deepcopy(model).half(), "updates": 0, "optimizer": None,
                "train_args": {"task": task, "imgsz": SIZE}, "date": "2026-01-01T00:00:00"},
               path)


def _ultralytics_predict(pt, image, monkeypatch) -> tuple[list[dict], object]:
    import_ultralytics()
    from ultralytics import YOLO
    from ultralytics.nn.autobackend import AutoBackend

    # its warmup imports torchvision, which the test environment cannot load (see
    # helpers/ultralytics_reference.py); warming up changes no result
    monkeypatch.setattr(AutoBackend, "warmup", lambda self, *a, **k: None)
    result = YOLO(str(pt)).predict(str(image), imgsz=SIZE, conf=0.25, iou=0.7, device="cpu",
                                   verbose=False, save=False)[0]
    out = []
    for i in range(len(result.boxes)):
        det = {"class_id": int(result.boxes.cls[i]), "score": float(result.boxes.conf[i]),
               "box_xyxy": result.boxes.xyxy[i].tolist()}
        if result.keypoints is not None:
            xy, conf = result.keypoints.xy[i].numpy(), result.keypoints.conf[i].numpy()
            det["keypoints"] = np.concatenate([xy, conf[:, None]], axis=1).tolist()
        out.append(det)
    return out, result


@pytest.mark.parametrize("yaml, nc", [("yolo11n.yaml", 3), ("yolo11n-pose.yaml", 1),
                                      ("yolo11n-seg.yaml", 3)])
def test_ultralytics_checkpoint_through_convert_and_cli(tmp_path, capsys, monkeypatch, yaml, nc):
    image = fixture_dir("images") / "bike.jpg"
    model = seeded_model(yaml, bike(128, SIZE), nc=nc)
    model.names = {i: name for i, name in enumerate(["cat", "dog", "bird"][:nc])}
    pt, converted = tmp_path / "best.pt", tmp_path / "best.safetensors"
    pose, seg = "-pose" in yaml, "-seg" in yaml
    task = "pose" if pose else "segment" if seg else "detect"
    _save_like_ultralytics(model, pt, task)

    assert weights_cli(["convert", "--from", "ultralytics", str(pt), str(converted)]) == 0
    meta = read_metadata(converted)
    model_name = {"pose": "yolo11_pose", "segment": "yolo11_seg"}.get(task, "yolo11")
    assert (meta.model, meta.variant, meta.task) == (model_name, "n", task)
    assert meta.names == list(model.names.values())
    capsys.readouterr()

    code = yolo_cli.main(["--weights", str(converted), "--image", str(image), "--size", str(SIZE),
                          "--json", "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert code == 0
    doc = json.loads(out)
    assert doc["model"] == {"pose": "YOLO11n-pose (1 class, 17 keypoints)",
                            "segment": "YOLO11n-seg (3 classes, 32 masks)"}.get(
                                task, "YOLO11n (3 classes)")
    ours = doc["images"][0]["detections"]
    assert (tmp_path / "run" / f"bike_{task}.jpg").is_file()

    want, result = _ultralytics_predict(pt, image, monkeypatch)
    assert len(want) >= 3 and len(ours) == len(want)
    for got, ref in zip(ours, want):
        assert got["class_id"] == ref["class_id"]
        assert got["class_name"] == model.names[ref["class_id"]]
        assert abs(got["score"] - ref["score"]) <= 1e-4
        assert np.abs(np.subtract(got["box_xyxy"], ref["box_xyxy"])).max() <= 0.1
        if pose:
            diff = np.abs(np.subtract(got["keypoints"], ref["keypoints"]))
            assert diff[:, :2].max() <= 0.1 and diff[:, 2].max() <= 1e-4
    if seg:
        from pycocotools import mask as mask_utils
        from ultralytics.utils import ops

        ref_masks = ops.scale_masks(result.masks.data[None].float(), result.orig_shape)[0] > 0.5
        for got, ref_mask in zip(ours, ref_masks.numpy()):
            rle = {"size": got["segmentation"]["size"],
                   "counts": got["segmentation"]["counts"].encode()}
            mask = mask_utils.decode(rle).astype(bool)
            iou = (mask & ref_mask).sum() / max((mask | ref_mask).sum(), 1)
            assert iou >= 0.999, iou


def test_a_yolo11_file_with_the_wrong_task_or_variant(tmp_path, capsys):
    model = seeded_model("yolo11n.yaml", bike(64, 64), nc=3)
    pt, converted = tmp_path / "best.pt", tmp_path / "best.safetensors"
    _save_like_ultralytics(model, pt)
    assert weights_cli(["convert", "--from", "ultralytics", str(pt), str(converted)]) == 0
    image = fixture_dir("images") / "bike.jpg"
    for flags, fragment in ((["--task", "pose"], "YOLO11n (3 classes), which does not match "
                                                 "--task pose"),
                            (["--variant", "s"], "does not match --variant s")):
        capsys.readouterr()
        code = yolo_cli.main(["--weights", str(converted), "--image", str(image),
                              "--out", str(tmp_path / "o"), *flags])
        assert code != 0
        assert fragment in one_error_line(capsys)

    # training is YOLOv8's: a YOLO11 file is named, not misread
    (tmp_path / "ds" / "images").mkdir(parents=True)
    (tmp_path / "ds" / "labels").mkdir()
    (tmp_path / "ds" / "images" / "bike.jpg").write_bytes(image.read_bytes())
    (tmp_path / "ds" / "labels" / "bike.txt").write_text("0 0.5 0.5 0.3 0.3\n")
    data = tmp_path / "ds" / "data.yaml"
    data.write_text(f"path: {tmp_path / 'ds'}\ntrain: images\nval: images\nnames: [a, b, c]\n")
    capsys.readouterr()
    assert yolo_cli.main(["train", "--data", str(data), "--weights", str(converted),
                          "--epochs", "1", "--out", str(tmp_path / "t")]) != 0
    assert "holds a YOLO11 model; `train` fine-tunes YOLOv8 only" in one_error_line(capsys)
