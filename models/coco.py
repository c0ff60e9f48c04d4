"""COCO's 80 detection class names and its 17-keypoint person skeleton (package data).

The names are COCO 2017's category names as ultralytics uses them ("motorcycle", "couch", "tv");
candle's ``coco_classes.rs`` has the same order with Darknet's spellings ("motorbike", "sofa",
"tvmonitor").
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

# Keypoints: 0 nose, 1-2 eyes, 3-4 ears, 5-6 shoulders, 7-8 elbows, 9-10 wrists, 11-12 hips,
# 13-14 knees, 15-16 ankles (left before right).
COCO_KEYPOINT_NAMES: tuple[str, ...] = (
    "nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
    "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip",
    "left_knee", "right_knee", "left_ankle", "right_ankle",
)

# COCO's person skeleton (its annotation file's 1-based pairs, here 0-based).
COCO_SKELETON: tuple[tuple[int, int], ...] = (
    (15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8),
    (7, 9), (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6),
)


@lru_cache(maxsize=1)
def coco_class_names() -> tuple[str, ...]:
    """The 80 COCO class names, indexed by class id."""
    names = resources.files(__package__).joinpath("data/coco_classes.txt")
    text = names.read_text(encoding="utf-8")
    names = tuple(line.strip() for line in text.splitlines() if line.strip())
    assert len(names) == 80, f"coco_classes.txt has {len(names)} names, expected 80"
    return names
