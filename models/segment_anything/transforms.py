"""MobileSAM's ``ResizeLongestSide``: images, points and boxes into the 1024-long-side frame.

Images are resized on the host with PIL's bilinear filter (what MobileSAM's torchvision-on-PIL
resize does), so the encoder input matches the reference to the uint8 rounding of that filter.
"""

from __future__ import annotations

import numpy as np


def preprocess_shape(height: int, width: int, long_side: int) -> tuple[int, int]:
    """``(new_height, new_width)`` with the longer side equal to ``long_side`` (rounded half up)."""
    scale = long_side * 1.0 / max(height, width)
    return int(height * scale + 0.5), int(width * scale + 0.5)


class ResizeLongestSide:
    """Resizes images to a longest side of ``target_length`` and maps coordinates accordingly.

    Coordinates are ``(..., 2)`` arrays of ``(x, y)`` pixels; boxes ``(..., 4)`` of
    ``x1, y1, x2, y2``. ``original_size`` is ``(height, width)``.
    """

    def __init__(self, target_length: int = 1024) -> None:
        self.target_length = int(target_length)

    def apply_image(self, image: np.ndarray) -> np.ndarray:
        """``(H, W, 3)`` uint8 → ``(h, w, 3)`` uint8 with ``max(h, w) == target_length``."""
        from PIL import Image

        h, w = self.target_size(image.shape[:2])
        return np.asarray(Image.fromarray(image).resize((w, h), Image.BILINEAR))

    def target_size(self, original_size: tuple[int, int]) -> tuple[int, int]:
        return preprocess_shape(original_size[0], original_size[1], self.target_length)

    def apply_coords(self, coords: np.ndarray, original_size: tuple[int, int]) -> np.ndarray:
        """Scale ``(..., 2)`` pixel ``(x, y)`` from the original image to the resized one."""
        old_h, old_w = original_size
        new_h, new_w = self.target_size(original_size)
        coords = np.array(coords, dtype=np.float32, copy=True)
        coords[..., 0] = coords[..., 0] * (new_w / old_w)
        coords[..., 1] = coords[..., 1] * (new_h / old_h)
        return coords

    def apply_boxes(self, boxes: np.ndarray, original_size: tuple[int, int]) -> np.ndarray:
        """Scale ``(..., 4)`` boxes ``x1, y1, x2, y2`` like :meth:`apply_coords`."""
        boxes = np.asarray(boxes, dtype=np.float32)
        return self.apply_coords(boxes.reshape(-1, 2, 2), original_size).reshape(boxes.shape)
