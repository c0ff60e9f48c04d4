"""The training augmentations move boxes with their pixels: a solid rectangle drawn on a grey
image must, after flip / affine / mosaic / the whole pipeline, still be covered by its box
(the box's interior is the rectangle's colour, its surroundings are not)."""

from __future__ import annotations

import numpy as np
import pytest

from candle_nn_models.yolo_v8_augment import (AugmentConfig, Labelled, augment_mosaic,
                                              augment_single, box_candidates, flip_lr,
                                              hsv_jitter, letterbox_labelled, load_resized,
                                              mosaic4, random_affine, to_targets)

RED = (230, 20, 20)


def _drawn(h: int = 80, w: int = 120, box=(30, 20, 70, 50), colour=RED, cls: int = 1) -> Labelled:
    image = np.full((h, w, 3), 114, np.uint8)
    x1, y1, x2, y2 = box
    image[y1:y2, x1:x2] = colour
    return Labelled(image, np.array([cls]), np.array([box], np.float32))


def _red_mask(image: np.ndarray) -> np.ndarray:
    return (image[..., 0] > 170) & (image[..., 1] < 90) & (image[..., 2] < 90)


def _assert_box_on_pixels(item: Labelled, colour_mask=_red_mask, tol: float = 2.0) -> None:
    """The single box of ``item`` is the bounding box of the coloured pixels (within ``tol``)."""
    assert len(item.boxes) == 1, item.boxes
    ys, xs = np.nonzero(colour_mask(item.image))
    assert len(xs), "the shape left the image but its box stayed"
    found = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32)
    np.testing.assert_allclose(item.boxes[0], found, atol=tol)


def test_flip_moves_box_with_pixels():
    item = flip_lr(_drawn())
    np.testing.assert_array_equal(item.boxes[0], [50, 20, 90, 50])
    _assert_box_on_pixels(item, tol=0)


@pytest.mark.parametrize("seed", range(6))
def test_affine_moves_box_with_pixels(seed):
    config = AugmentConfig(degrees=0.0, translate=0.1, scale=0.5, shear=0.0)
    item = random_affine(_drawn(), np.random.default_rng(seed), config)
    if len(item.boxes):  # dropped only when mostly outside
        _assert_box_on_pixels(item)
    else:
        assert _red_mask(item.image).sum() < 0.1 * 40 * 30 * 1.5 ** 2


@pytest.mark.parametrize("seed", range(3))
def test_rotated_shear_box_encloses_pixels(seed):
    config = AugmentConfig(degrees=20.0, translate=0.0, scale=0.0, shear=5.0)
    item = random_affine(_drawn(), np.random.default_rng(seed), config)
    ys, xs = np.nonzero(_red_mask(item.image))
    x1, y1, x2, y2 = item.boxes[0]
    assert xs.min() >= x1 - 1 and xs.max() + 1 <= x2 + 1
    assert ys.min() >= y1 - 1 and ys.max() + 1 <= y2 + 1


@pytest.mark.parametrize("seed", range(4))
def test_mosaic_keeps_each_box_on_its_shape(seed):
    colours = [(230, 20, 20), (20, 200, 20), (20, 20, 230), (230, 230, 20)]
    parts = [_drawn(64, 64, (10 + 4 * i, 12, 40 + 4 * i, 50), c, cls=i)
             for i, c in enumerate(colours)]
    item = mosaic4(parts, 64, np.random.default_rng(seed))
    assert item.image.shape == (128, 128, 3)
    for cls, box in zip(item.classes, item.boxes):
        colour = np.array(colours[cls])
        mask = (np.abs(item.image.astype(int) - colour).sum(-1) < 30)
        x1, y1, x2, y2 = (int(round(v)) for v in box)
        if x2 - x1 < 2 or y2 - y1 < 2:
            continue  # clipped away by the canvas edge
        assert mask[y1:y2, x1:x2].all(), (cls, box)
        assert mask.sum() == (x2 - x1) * (y2 - y1)  # no pixel of the shape outside its box


@pytest.mark.parametrize("seed", range(4))
def test_full_pipelines_are_seeded_and_aligned(seed):
    config = AugmentConfig(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)  # colour kept for the check
    def parts():
        return [load_resized(_drawn().image, np.array([0]), np.array(
            [[50 / 120, 35 / 80, 40 / 120, 30 / 80]], np.float32), 96) for _ in range(4)]
    a = augment_mosaic(parts(), 96, np.random.default_rng(seed), config)
    b = augment_mosaic(parts(), 96, np.random.default_rng(seed), config)
    np.testing.assert_array_equal(a.image, b.image)
    np.testing.assert_array_equal(a.boxes, b.boxes)
    assert a.image.shape == (96, 96, 3)
    single = augment_single(parts()[0], 96, np.random.default_rng(seed), config)
    assert single.image.shape == (96, 96, 3)
    if len(single.boxes):
        _assert_box_on_pixels(single, tol=2.5)
    t = to_targets(single)
    assert t.shape == (len(single.boxes), 5) and (t[:, 1:] >= 0).all() and (t[:, 1:] <= 1).all()


def test_letterbox_and_resize_keep_boxes():
    item = load_resized(_drawn().image, np.array([1]),
                        np.array([[50 / 120, 35 / 80, 40 / 120, 30 / 80]], np.float32), 60)
    assert item.image.shape == (40, 60, 3)
    np.testing.assert_allclose(item.boxes[0], [15, 10, 35, 25], atol=1e-4)
    boxed = letterbox_labelled(item, 64)
    assert boxed.image.shape == (64, 64, 3)
    _assert_box_on_pixels(boxed, tol=1.0)


def test_hsv_changes_colour_not_geometry():
    image = _drawn().image
    out = hsv_jitter(image, np.random.default_rng(0), 0.015, 0.7, 0.4)
    assert out.shape == image.shape and out.dtype == np.uint8
    assert not np.array_equal(out, image)
    assert np.array_equal(hsv_jitter(image, np.random.default_rng(0), 0, 0, 0), image)


def test_box_candidates_drop_slivers():
    before = np.array([[0, 0, 40, 40], [0, 0, 40, 40]], np.float32)
    after = np.array([[0, 0, 40, 40], [0, 0, 1.5, 40]], np.float32)
    assert box_candidates(before, after).tolist() == [True, False]
