"""YOLOv8's model sizes n/s/m/l/x as ultralytics' ``scales`` table (depth, width, max channels),
shared by the detection, pose, segmentation and classification models."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MULTIPLES", "Multiples", "multiples", "variant_of"]


@dataclass(frozen=True)
class Multiples:
    """Depth/width scaling of one size: ultralytics' ``[depth, width, max_channels]`` with
    ``ratio = min(max_channels, 1024) / 512``, the extra width of the stride-32 stage."""

    depth: float
    width: float
    ratio: float

    def channels(self, base: float) -> int:
        return int(base * self.width)

    def repeats(self, base: int) -> int:
        return round(base * self.depth)

    def max_channels(self) -> int:
        """ultralytics' ``max_channels`` (capped at 1024)."""
        return int(512 * self.ratio)

    def filters(self) -> tuple[int, int, int]:
        """Channels of the neck's p3, p4, p5 outputs."""
        return self.channels(256), self.channels(512), self.channels(512 * self.ratio)


MULTIPLES: dict[str, Multiples] = {
    "n": Multiples(depth=0.33, width=0.25, ratio=2.0),
    "s": Multiples(depth=0.33, width=0.50, ratio=2.0),
    "m": Multiples(depth=0.67, width=0.75, ratio=1.5),
    "l": Multiples(depth=1.00, width=1.00, ratio=1.0),
    "x": Multiples(depth=1.00, width=1.25, ratio=1.0),
}


def multiples(variant: str) -> Multiples:
    if variant not in MULTIPLES:
        raise ValueError(
            f"unknown YOLOv8 variant {variant!r}; choose one of {', '.join(MULTIPLES)}")
    return MULTIPLES[variant]


def variant_of(stem_channels: int, bottlenecks: int) -> str | None:
    """The size whose stem conv has ``stem_channels`` outputs and whose stride-8 C2f (``net.b2.2``)
    has ``bottlenecks`` bottlenecks; ``None`` when none has."""
    return next((v for v, m in MULTIPLES.items()
                 if m.channels(64) == stem_channels and m.repeats(6) == bottlenecks), None)
