"""``candle-nn-app`` under load and abuse, over plain HTTP: 20 prompt requests at once from two
visitors are queued through the one model worker and every answer is the predictor's mask; the
caches stay within their limits as visitors and images come and go; bad requests are refused with
one message. Plus the worker's queue limit and the LRU tables on their own."""

from __future__ import annotations

import base64
import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from candle_nn import Device
from candle_nn_models.scripts.app_sample import sample_image
from candle_nn_models.scripts.app_sessions import LRU, Sessions
from candle_nn_models.scripts.app_worker import BusyError, ModelWorker
from helpers.app import get, post, running_app, weights_args

LIMITS = {"--max-sessions": 2, "--max-images": 2, "--max-embeddings": 1}
MASK_MISMATCH = 1e-3  # as the browser test: logits within rounding of the threshold may flip


@pytest.fixture(scope="module")
def app_url():
    args = [str(a) for kv in LIMITS.items() for a in kv]
    with running_app(*args, "--max-upload-mb", "1") as url:
        yield url


@pytest.fixture(scope="module")
def predictor():
    from candle_nn_models.scripts.segment_anything import load_sam
    from candle_nn_models.segment_anything import SamPredictor

    paths = dict(zip(weights_args()[::2], weights_args()[1::2]))
    sam, _, _ = load_sam(None, paths["--sam-weights"], Device.parse("cpu"))
    return SamPredictor(sam)


def images() -> dict[str, np.ndarray]:
    """Three different small images: the sample, its mirror, and the sample turned upside down."""
    rgb = sample_image()
    return {"a": rgb, "b": np.ascontiguousarray(rgb[:, ::-1]),
            "c": np.ascontiguousarray(rgb[::-1])}


def png(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def upload(url: str, rgb: np.ndarray, session: str | None = None) -> tuple[str, str]:
    status, answer = post(url, "/api/upload", png(rgb), {"X-Session": session or ""})
    assert status == 200, answer
    return answer["session"], answer["image"]


def expected_masks(predictor, rgb: np.ndarray, points) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(best mask, scores)`` per point, one positive point each, as the app computes them."""
    predictor.set_image(rgb)
    out = []
    for point in points:
        logits, scores, _ = predictor.predict(point_coords=np.array([point], np.float32),
                                              point_labels=np.array([1], np.int32),
                                              multimask_output=True, return_logits=True)
        out.append((logits[int(np.argmax(scores))] > predictor.model.mask_threshold, scores))
    return out


def check_answer(answer: dict, mask: np.ndarray, scores: np.ndarray) -> None:
    best = answer["masks"][answer["best"]]
    page = np.asarray(Image.open(io.BytesIO(base64.b64decode(best["png"]))).convert("L")) > 127
    assert page.shape == mask.shape
    assert int((page != mask).sum()) <= MASK_MISMATCH * mask.size
    assert best["area"] == int(page.sum())
    np.testing.assert_allclose([m["predicted_iou"] for m in answer["masks"]], scores, atol=2e-4)


def segment(url: str, session: str, image: str, point) -> tuple[int, dict]:
    return post(url, "/api/segment", {"session": session, "image": image, "points": [point],
                                      "labels": [1]})


def test_twenty_concurrent_prompts_and_bounded_caches(app_url, predictor):
    imgs = images()
    s1, a = upload(app_url, imgs["a"])
    s2, b = upload(app_url, imgs["b"])
    rng = np.random.default_rng(0)
    jobs = [(s1, a, "a") if i % 3 else (s2, b, "b") for i in range(20)]
    points = [[float(x), float(y)] for x, y in zip(rng.integers(10, 310, 20),
                                                      rng.integers(10, 230, 20))]
    barrier = threading.Barrier(len(jobs))

    def fire(i: int) -> tuple[int, dict]:
        barrier.wait()  # all 20 requests leave together
        session, image, _ = jobs[i]
        return segment(app_url, session, image, points[i])

    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(fire, range(len(jobs))))
    for name in ("a", "b"):
        mine = [i for i, job in enumerate(jobs) if job[2] == name]
        for i, (mask, scores) in zip(mine, expected_masks(predictor, imgs[name],
                                                          [points[i] for i in mine])):
            status, answer = answers[i]
            assert status == 200, answer
            check_answer(answer, mask, scores)
    status = get(app_url, "/api/status")
    assert status["queued"] == 0
    assert (status["sessions"], status["images"], status["embeddings"]) == (2, 2, 2)

    # a second image in visitor 1: its embedding replaces the first one's (1 per visitor) ...
    _, c = upload(app_url, imgs["c"], s1)
    [(mask_c, scores_c)] = expected_masks(predictor, imgs["c"], [[160.0, 60.0]])
    code, answer = segment(app_url, s1, c, [160.0, 60.0])
    assert code == 200, answer
    check_answer(answer, mask_c, scores_c)
    assert get(app_url, "/api/status")["max_embeddings_per_session"] == 1
    # ... and the first image's embedding, evicted, is computed again, right
    [(mask_a, scores_a)] = expected_masks(predictor, imgs["a"], [[80.0, 120.0]])
    code, answer = segment(app_url, s1, a, [80.0, 120.0])
    assert code == 200 and not answer["embedding_cached"], answer
    check_answer(answer, mask_a, scores_a)

    # a third image in visitor 1 evicts its least recently used one (c)
    upload(app_url, imgs["b"], s1)
    code, answer = segment(app_url, s1, c, [10.0, 10.0])
    assert code == 400 and "no longer held" in answer["error"], answer
    # a third visitor evicts the least recently active one (visitor 2)
    s3, _ = upload(app_url, imgs["c"])
    code, answer = segment(app_url, s2, b, [10.0, 10.0])
    assert code == 400 and "session has expired" in answer["error"], answer
    status = get(app_url, "/api/status")
    assert status["sessions"] == LIMITS["--max-sessions"]
    assert status["max_images_per_session"] <= LIMITS["--max-images"]
    assert status["max_embeddings_per_session"] <= LIMITS["--max-embeddings"]
    assert s3 not in (s1, s2)


def test_bad_requests_are_one_message(app_url):
    import urllib.request

    session, image = upload(app_url, sample_image())
    refusals = [
        ("/api/upload", b"\0" * (1 << 20 | 1), 413, "above the 1.0 MiB limit"),
        ("/api/upload", b"GIF89a" + b"\0" * 40, 400, "upload: not a readable image"),
        ("/api/segment", b"{not json", 400, "not JSON"),
        ("/api/segment", {"session": "nope", "image": image, "points": [[1, 1]], "labels": [1]},
         400, "session has expired"),
        ("/api/segment", {"session": session, "image": image, "points": [[400, 10]],
                          "labels": [1]}, 400, "outside the 320x240 image"),
        ("/api/segment", {"session": session, "image": image, "points": [[1, 1]],
                          "labels": [7]}, 400, "label must be 1"),
        ("/api/segment", {"session": session, "image": image}, 400, "no prompt"),
        ("/api/everything", {"session": session, "image": image, "points_per_side": 500},
         400, "at most 64"),
        ("/api/detect", {"session": session, "image": image, "conf": 2}, 400, "from 0 to 1"),
        ("/api/classify", {"session": session, "image": image, "top_k": "all"}, 400, "top-k"),
        ("/api/../../etc/passwd", {}, 404, "no such API"),
    ]
    for path, body, code, text in refusals:
        status, answer = post(app_url, path, body)
        assert (status, set(answer)) == (code, {"error"}), (path, answer)
        assert text in answer["error"] and "Traceback" not in answer["error"], (path, answer)
    request = urllib.request.Request(app_url + "/api/status", headers={"Host": "evil.example"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 403


def test_worker_queue_limit_answers_busy():
    worker = ModelWorker(max_queue=2)
    release = threading.Event()
    threads = [threading.Thread(target=worker.run, args=(release.wait,)) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while worker.pending < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(BusyError, match="busy"):
        worker.run(lambda: None)
    release.set()
    for t in threads:
        t.join()
    assert worker.run(threading.get_ident) != threading.get_ident()  # on the worker's thread
    worker.shutdown()


def test_lru_tables_evict_the_least_recently_used():
    table = LRU(2)
    table.put("x", 1)
    table.put("y", 2)
    assert table.get("x") == 1  # x is now the most recent
    table.put("z", 3)
    assert (table.get("y"), table.get("x"), table.get("z"), len(table)) == (None, 1, 3, 2)
    sessions = Sessions(max_sessions=1, max_images=1, max_embeddings=1)
    first, _ = sessions.add_image(None, np.zeros((2, 2, 3), np.uint8))
    second, _ = sessions.add_image(None, np.zeros((2, 2, 3), np.uint8))
    assert first != second and sessions.counts()["sessions"] == 1


def test_everything_knobs_leave_points_per_batch_to_the_generator():
    """A request without ``points_per_batch`` leaves it to the generator (64 on the CPU, 256
    on a GPU); one that names it is checked and capped like every knob."""
    from candle_nn_models.scripts.app_models import PromptError, _knobs

    knobs = _knobs({"points_per_side": 4})
    assert "points_per_batch" not in knobs and knobs["points_per_side"] == 4
    assert _knobs({"points_per_batch": 16})["points_per_batch"] == 16
    with pytest.raises(PromptError, match="at most 256"):
        _knobs({"points_per_batch": 1000})
    with pytest.raises(PromptError, match="points per batch"):
        _knobs({"points_per_batch": 0})
