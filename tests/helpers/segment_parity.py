"""The YOLO segmentation parity checks against an ultralytics ``SegmentationModel``, shared by
the YOLOv8 and YOLO11 tests: the head's output and prototypes within the float32 rule of
``../shared/fixtures/README.md``, and the final masks of ``process_mask`` /
``process_mask_native`` (IoU >= 0.999 after thresholding)."""

from __future__ import annotations

import numpy as np
import torch

from helpers.ultralytics_models import tolerance


def reference(ref, x: np.ndarray, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """ultralytics' ``(pred, proto)`` for the NHWC input ``x`` in ``dtype`` (``ref`` is left in
    float32)."""
    with torch.no_grad():
        (pred, proto), _ = ref.to(dtype)(torch.from_numpy(x).permute(0, 3, 1, 2).to(dtype))
    ref.float()
    return pred, proto


def assert_head_matches(ref, x: np.ndarray, pred: np.ndarray, protos: np.ndarray,
                        label: str) -> None:
    """Our ``pred`` ``(N, 4 + 80 + 32, A)`` and NHWC ``protos`` against ``ref`` on ``x``."""
    f32, f64 = (reference(ref, x, d) for d in (torch.float32, torch.float64))
    assert pred.shape == f32[0].shape, (pred.shape, f32[0].shape)
    for index, got in enumerate((pred, protos.transpose(0, 3, 1, 2))):
        want = f32[index].numpy()
        tol = tolerance(want, f64[index].numpy())
        err = np.abs(got - want).max() / np.abs(want).max()
        print(f"{('pred', 'protos')[index]} on {label}: rel err {err:.2e} (tolerance {tol:.2e})")
        assert err <= tol, (index, err, tol)


def assert_masks_match(ref, lb, pred: np.ndarray, protos: np.ndarray, retina: bool):
    """Our ``segment_postprocess`` of ``pred``/``protos`` (80 classes, 32 masks, conf 0.25, IoU
    0.7) against ultralytics' NMS and ``process_mask(_native)`` for the letterboxed ``lb``: same
    boxes (within 1e-3 of the input size), classes, and masks (IoU >= 0.999). Returns
    ``(detections, masks, want_masks)`` for further checks."""
    from ultralytics.utils import ops
    from ultralytics.utils.nms import non_max_suppression

    from candle_nn_models.yolo_v8_masks import segment_postprocess

    x = lb.as_input()
    ((detections, masks),) = segment_postprocess(pred, protos, [lb], num_classes=80,
                                                 num_masks=32, retina=retina, conf=0.25,
                                                 iou=0.7)
    want_pred, want_proto = reference(ref, x, torch.float32)
    want = non_max_suppression(want_pred, 0.25, 0.7, nc=80)[0]
    assert 3 <= len(want) <= 300, len(want)  # the seeded class biases give real detections
    if retina:
        want[:, :4] = ops.scale_boxes(x.shape[1:3], want[:, :4], lb.orig_hw)
        want_masks = ops.process_mask_native(want_proto[0], want[:, 6:], want[:, :4], lb.orig_hw)
    else:
        want_masks = ops.process_mask(want_proto[0], want[:, 6:], want[:, :4], x.shape[1:3],
                                      upsample=True)
        want[:, :4] = ops.scale_boxes(x.shape[1:3], want[:, :4], lb.orig_hw)
    keep = want_masks.amax((-2, -1)) > 0
    want, want_masks = want[keep].numpy(), want_masks[keep].numpy()
    assert len(detections) == len(want) >= 3
    np.testing.assert_allclose(np.stack([d.box_xyxy for d in detections]), want[:, :4],
                               atol=1e-3 * max(x.shape[1:3]))
    assert [d.class_id for d in detections] == want[:, 5].astype(int).tolist()
    assert masks.data.shape == want_masks.shape
    for got, ref_mask in zip(masks.data, want_masks):
        assert iou(got, ref_mask) >= 0.999
    return detections, masks, want_masks


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two masks (nonzero = inside); two empty masks agree."""
    a, b = a.astype(bool), b.astype(bool)
    union = (a | b).sum()
    return float((a & b).sum() / union) if union else 1.0
