"""The YOLO task API (YOLOv8 and YOLO11: detect, pose, segment, classify), as ultralytics' YOLO::

    from candle_nn_models import yolo
    model = yolo.load("yolov8n.safetensors", device="cpu")  # no path: candle's published yolov8n
    results = model.predict(["bus.jpg", rgb_uint8], conf=0.25, iou=0.7)  # one Result per image
    r = results[0]
    r.boxes.xyxy, r.boxes.conf, r.boxes.cls, r.masks, r.keypoints, r.probs, r.names
    r.to_json()  # the record `candle-yolo-v8 --json` prints; r.plot(): the image it saves

``candle-yolo-v8`` is a client of this package: its options are :class:`PredictOptions`' fields.
"""

from .model import YOLO, load
from .options import PredictOptions
from .result import Boxes, Result

__all__ = ["YOLO", "Boxes", "PredictOptions", "Result", "load"]
