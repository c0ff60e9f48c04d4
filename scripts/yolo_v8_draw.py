"""``candle-yolo-v8``'s drawing of detections: :func:`candle_nn_models.yolo.draw.draw_detections`,
the one that ``Result.plot`` of the YOLO task API uses."""

from candle_nn_models.yolo.draw import draw_detections  # noqa: F401
