"""``MaskData``: the columns of a set of candidate masks (boxes, scores, RLEs, ...), filtered and
concatenated together."""

from __future__ import annotations

from typing import Any, ItemsView

import numpy as np


class MaskData:
    """Named columns of equal length: NumPy arrays (first axis = mask) or lists."""

    def __init__(self, **columns: Any) -> None:
        self._stats: dict[str, Any] = {}
        for key, value in columns.items():
            self[key] = value

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(value, (list, np.ndarray)):
            raise TypeError(f"MaskData column {key!r} must be a list or a NumPy array, "
                            f"not {type(value).__name__}")
        self._stats[key] = value

    def __getitem__(self, key: str) -> Any:
        return self._stats[key]

    def __delitem__(self, key: str) -> None:
        del self._stats[key]

    def __contains__(self, key: str) -> bool:
        return key in self._stats

    def __len__(self) -> int:
        return len(next(iter(self._stats.values()), []))

    def items(self) -> ItemsView[str, Any]:
        return self._stats.items()

    def filter(self, keep: np.ndarray) -> None:
        """Keep the rows selected by a boolean mask or an index array (in that order)."""
        keep = np.asarray(keep)
        indices = np.flatnonzero(keep) if keep.dtype == bool else keep.astype(np.int64)
        for key, value in self._stats.items():
            if isinstance(value, np.ndarray):
                self._stats[key] = value[indices]
            else:
                self._stats[key] = [value[i] for i in indices]

    def cat(self, other: "MaskData") -> None:
        """Append ``other``'s rows."""
        for key, value in other.items():
            if key not in self._stats:
                self._stats[key] = value
            elif isinstance(value, np.ndarray):
                self._stats[key] = np.concatenate([self._stats[key], value], axis=0)
            else:
                self._stats[key] = self._stats[key] + list(value)
