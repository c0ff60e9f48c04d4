"""The training data set: broken images and malformed label lines skipped with one warning each,
the label cache (reused, rebuilt when a file changes, never code), seeded samples, the loader."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from candle_nn_models.yolo_v8_data import DataConfig
from candle_nn_models.image_loader import BatchLoader
from candle_nn_models.yolo_v8_dataset import DetectionDataset, collate

from helpers.shapes_dataset import make_shapes


def _dataset(tmp_path, **kw):
    data = DataConfig.load(make_shapes(tmp_path / "shapes", n_train=6, n_val=2, size=64))
    warnings: list[str] = []
    ds = DetectionDataset(data.images("train"), data.names, 64, warn=warnings.append, **kw)
    return data, ds, warnings


def test_bad_images_and_lines_warned_once_each_and_skipped(tmp_path):
    data, clean, warnings = _dataset(tmp_path)
    assert len(clean) == 6 and warnings == []
    root = tmp_path / "shapes"
    (root / "images/train/0000.png").write_bytes(b"not a png at all")  # corrupt image
    (root / "images/train/0001.png").write_bytes(
        (root / "images/train/0001.png").read_bytes()[:60])  # truncated
    label = root / "labels/train/0002.txt"
    good = label.read_text().splitlines()
    label.write_text("\n".join(good + ["7 0.5 0.5 0.1 0.1", "0 0.5 nan 0.1 0.1", "0 0.5 0.5"])
                     + "\n")
    warnings = []
    ds = DetectionDataset(data.images("train"), data.names, 64, warn=warnings.append)
    assert len(ds) == 4
    assert sum("0000.png" in w and "image skipped" in w for w in warnings) == 1
    assert sum("0001.png" in w for w in warnings) == 1
    assert sum("0002.txt" in w for w in warnings) == 3
    assert len(warnings) == 5
    kept = ds.images.index(root / "images/train/0002.png")
    assert len(ds.labels[kept].classes) == len(good)  # every good box kept


def test_label_cache_reused_and_rebuilt_on_change(tmp_path):
    data, ds, _ = _dataset(tmp_path)
    cache = tmp_path / "shapes/labels/train.cache"
    content = json.loads(cache.read_text())  # JSON: data, never code
    assert content["version"] == 1 and len(content["entries"]) == 6
    content["entries"][0]["classes"] = [2] * len(content["entries"][0]["classes"])
    cache.write_text(json.dumps(content))  # a cache with the same key is trusted ...
    again = DetectionDataset(data.images("train"), data.names, 64, warn=print)
    assert set(again.labels[0].classes.tolist()) <= {2}
    label = tmp_path / "shapes/labels/train/0000.txt"
    label.write_text("1 0.5 0.5 0.2 0.2\n")  # ... until a file changes
    rebuilt = DetectionDataset(data.images("train"), data.names, 64, warn=print)
    assert rebuilt.labels[0].classes.tolist() == [1]


def test_samples_are_seeded_and_loader_keeps_order(tmp_path):
    data, ds, _ = _dataset(tmp_path, seed=3)
    a, ta = ds.sample(2, epoch=1, mosaic=True)
    b, tb = ds.sample(2, epoch=1, mosaic=True)
    c, _ = ds.sample(2, epoch=2, mosaic=True)
    assert a.shape == (64, 64, 3) and np.array_equal(a, b) and np.array_equal(ta, tb)
    assert not np.array_equal(a, c)
    batches = [[0, 1, 2], [3, 4], [5]]
    with ThreadPoolExecutor(3) as pool:
        got = list(BatchLoader(batches, lambda i: ds.sample(i, 0, True), collate, pool))
    assert [x.shape[0] for x, _ in got] == [3, 2, 1]
    x, t = got[0]
    assert x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1
    np.testing.assert_array_equal(x[1], ds.sample(1, 0, True)[0] / np.float32(255))
    assert t.shape[1] == 6 and set(t[:, 0].tolist()) <= {0, 1, 2}


def test_a_split_without_labels_is_warned(tmp_path):
    """No label file found for any image (a wrong layout): one warning naming where the labels
    were looked for, as ultralytics warns, instead of training on background alone."""
    data = DataConfig.load(make_shapes(tmp_path / "shapes", n_train=4, n_val=2, size=64))
    for label in (tmp_path / "shapes/labels/train").iterdir():
        label.unlink()
    warnings: list[str] = []
    ds = DetectionDataset(data.images("train"), data.names, 64, warn=warnings.append,
                          cache=False)
    assert len(ds) == 4
    assert len(warnings) == 1, warnings
    assert "no labels" in warnings[0] and str(tmp_path / "shapes/labels/train") in warnings[0]


def test_a_list_split_keeps_its_cache_in_the_data_set_and_names_missing_images(tmp_path):
    """A train list whose first (sorted) entry lies outside the data set: the label cache is
    written inside the data set (beside the list), never in the other folder; a listed image
    that does not exist is "not found", not corrupt."""
    root = tmp_path / "shapes"
    make_shapes(root, n_train=3, n_val=1, size=64)
    outside = tmp_path / "a_elsewhere"  # sorts before shapes/
    (outside / "images").mkdir(parents=True)
    (outside / "labels").mkdir()
    (root / "images/train/0000.png").rename(outside / "images/0000.png")
    (root / "labels/train/0000.txt").rename(outside / "labels/0000.txt")
    listed = [outside / "images/0000.png", root / "images/train/0001.png",
              root / "images/train/0002.png", root / "images/train/missing.png"]
    (root / "train.txt").write_text("".join(f"{p}\n" for p in listed))
    yaml = root / "data.yaml"
    yaml.write_text(yaml.read_text().replace("train: images/train", "train: train.txt"))
    data = DataConfig.load(yaml)
    warnings: list[str] = []
    ds = DetectionDataset(data.images("train"), data.names, 64, warn=warnings.append,
                          cache=data.cache_path("train"))
    assert len(ds) == 3
    assert len(warnings) == 1 and "missing.png: not found" in warnings[0], warnings
    assert "corrupt" not in warnings[0]
    assert data.cache_path("train") == root / "train.cache" and (root / "train.cache").is_file()
    assert not list(tmp_path.glob("*.cache")) and not list(outside.rglob("*.cache"))
