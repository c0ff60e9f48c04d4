"""What ``candle-nn-app`` keeps per browser session: its images and, for the newest few, SAM's
image embeddings — each level a least-recently-used table with a fixed capacity, so the memory a
server holds is bounded whatever its visitors do.

Memory at most: ``max_sessions x (max_images x max_pixels x 3 bytes`` of decoded RGB ``+
max_embeddings x 4 MiB)`` (an embedding is ``(1, 64, 64, 256)`` float32). An image that is evicted
must be uploaded again; an evicted embedding is simply computed again on the next prompt.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Generic, Hashable, TypeVar

import numpy as np

from candle_nn import CandleNNError

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SessionError(CandleNNError):
    """A request names a session or image the server no longer (or never) held."""


class LRU(Generic[K, V]):
    """A dict of at most ``capacity`` entries; adding one more evicts the least recently used."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used), or ``None``."""
        if key not in self._items:
            return None
        self._items.move_to_end(key)
        return self._items[key]

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def values(self) -> list[V]:
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class Embedding:
    """SAM's encoder output for one image, as :meth:`SamPredictor.set_image_embedding` takes it."""

    features: Any  # mx.array (1, 64, 64, 256)
    original_size: tuple[int, int]
    input_size: tuple[int, int]


@dataclass
class Session:
    """One visitor's images (``id -> (H, W, 3) uint8 RGB``) and embeddings (``id -> Embedding``)."""

    id: str
    images: LRU[str, np.ndarray]
    embeddings: LRU[str, Embedding]
    _next: int = field(default=0)

    def add_image(self, rgb: np.ndarray) -> str:
        self._next += 1
        image_id = f"img{self._next}"
        self.images.put(image_id, rgb)
        return image_id

    def image(self, image_id: str) -> np.ndarray:
        rgb = self.images.get(image_id)
        if rgb is None:
            raise SessionError("this image is no longer held by the server (it keeps "
                               f"{self.images.capacity} per visitor): upload it again")
        return rgb


class Sessions:
    """Every visitor's :class:`Session`, at most ``max_sessions`` (least recently used evicted).
    Thread-safe: HTTP threads add images, the model worker reads images and caches embeddings."""

    def __init__(self, max_sessions: int, max_images: int, max_embeddings: int) -> None:
        self._sessions: LRU[str, Session] = LRU(max_sessions)
        self.max_sessions = max_sessions
        self.max_images, self.max_embeddings = max_images, max_embeddings
        self._lock = threading.Lock()

    def add_image(self, session_id: str | None, rgb: np.ndarray) -> tuple[str, str]:
        """Store ``rgb`` in ``session_id`` (a new session when absent or evicted);
        ``(session id, image id)``."""
        with self._lock:
            session = self._sessions.get(session_id) if session_id else None
            if session is None:
                session = Session(secrets.token_urlsafe(16), LRU(self.max_images),
                                  LRU(self.max_embeddings))
                self._sessions.put(session.id, session)
            return session.id, session.add_image(rgb)

    def image(self, session_id: str, image_id: str) -> np.ndarray:
        with self._lock:
            return self._session(session_id).image(image_id)

    def embedding(self, session_id: str, image_id: str) -> Embedding | None:
        with self._lock:
            return self._session(session_id).embeddings.get(image_id)

    def put_embedding(self, session_id: str, image_id: str, embedding: Embedding) -> None:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None:  # evicted meanwhile: nothing to keep it for
                session.embeddings.put(image_id, embedding)

    def counts(self) -> dict[str, int]:
        """How much is held: sessions, images and embeddings in all, and the largest per-session
        counts (what the limits bound)."""
        with self._lock:
            sessions = self._sessions.values()
            return {"sessions": len(sessions),
                    "images": sum(len(s.images) for s in sessions),
                    "embeddings": sum(len(s.embeddings) for s in sessions),
                    "max_images_per_session": max((len(s.images) for s in sessions), default=0),
                    "max_embeddings_per_session": max((len(s.embeddings) for s in sessions),
                                                      default=0)}

    def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionError("this page's session has expired (the server keeps "
                               f"{self._sessions.capacity} visitors' images): upload the image "
                               "again or reload the page")
        return session
