"""``(h, w)`` size arguments: an int or a pair, as convolutions, pooling and letterboxing take."""

from __future__ import annotations


def pair(v: "int | tuple[int, int]") -> tuple[int, int]:
    """``v`` as an ``(h, w)`` pair of ints: an int is used for both."""
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))
