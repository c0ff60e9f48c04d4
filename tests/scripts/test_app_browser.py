"""``candle-nn-app`` in a real browser: Debian's headless Chromium driven by Selenium clicks, drags
and uploads on the page as a user does, and what the page shows is compared with the models' own
answers computed here on the same fixture weights (random: the masks are arbitrary, but
deterministic). The screenshots of the three views are the README's (``docs/app-*.png``: run with
``CANDLE_NN_APP_SCREENSHOTS=docs``)."""

from __future__ import annotations

import numpy as np
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from candle_nn import Device
from candle_nn_models.scripts.app_sample import sample_image
from helpers.app import chromium, running_app, screenshot_dir, weights_args

WAIT_S = 240
# A mask pixel whose logit sits within float32 rounding of the threshold may flip between two
# processes' runs: at most this fraction of the image may differ (none did when written).
MASK_MISMATCH = 1e-3


@pytest.fixture(scope="module")
def app_url():
    with running_app() as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    driver = chromium()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def models():
    """The models the app serves, loaded here as the app loads them."""
    from candle_nn_models.scripts.resnet import load_classifier
    from candle_nn_models.scripts.segment_anything import load_sam
    from candle_nn_models.scripts.yolo_v8_weights import load_yolo

    paths = dict(zip(weights_args()[::2], weights_args()[1::2]))
    cpu = Device.parse("cpu")
    sam, _, _ = load_sam(None, paths["--sam-weights"], cpu)
    detector = load_yolo(paths["--detect-weights"], "detect", None, cpu)
    classifier, labels, _ = load_classifier(paths["--classify-weights"], None, cpu)
    return {"sam": sam, "detect": detector, "classify": (classifier, labels)}


def js(driver, script: str):
    return driver.execute_script(script)


def wait_for(driver, script: str, what: str):
    """Wait until ``script`` (a JS expression) is truthy; its value."""
    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(
            lambda d: d.execute_script(f"return ({script});"))
    except Exception:
        message = js(driver, "return document.getElementById('message').textContent")
        pytest.fail(f"the page never showed {what}; its message: {message!r}")


def open_sample(driver, url: str) -> None:
    """Load the page and take the sample image; wait for its embedding."""
    driver.get(url + "/")
    wait_for(driver, "window.candleApp && window.candleApp.info", "the models' info")
    driver.find_element(By.ID, "sample").click()
    wait_for(driver, "document.getElementById('message').textContent.includes('embedding "
                     "ready')", "the sample's embedding")


def page_mask(driver) -> np.ndarray:
    """The mask layer's pixels that are drawn (alpha > 0), ``(H, W)`` bool."""
    bits = js(driver, """
        const c = document.getElementById('mask');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let s = '';
        for (let i = 3; i < d.length; i += 4) s += d[i] > 0 ? '1' : '0';
        return [c.height, c.width, s];""")
    h, w, s = bits
    return (np.frombuffer(s.encode(), dtype=np.uint8) == ord("1")).reshape(h, w)


def assert_same_mask(page: np.ndarray, expected: np.ndarray) -> None:
    assert page.shape == expected.shape
    assert expected.any() and not expected.all(), "choose a prompt with a non-trivial mask"
    differ = int((page != expected).sum())
    assert differ <= MASK_MISMATCH * expected.size, (
        f"{differ} of {expected.size} pixels differ from the predictor's mask")


def predictor_mask(sam, points, labels, box) -> tuple[np.ndarray, int]:
    from candle_nn_models.segment_anything import SamPredictor

    predictor = SamPredictor(sam)
    predictor.set_image(sample_image())
    logits, scores, _ = predictor.predict(
        point_coords=np.array(points, np.float32) if points else None,
        point_labels=np.array(labels, np.int32) if points else None,
        box=np.array(box, np.float32) if box else None, multimask_output=True,
        return_logits=True)
    best = int(np.argmax(scores))
    return logits[best] > sam.mask_threshold, best


def click_at(driver, x: float, y: float, *, shift: bool = False) -> None:
    """Click the image at pixel ``(x, y)`` (shown at its natural size)."""
    marks = driver.find_element(By.ID, "marks")
    size = marks.size
    actions = ActionChains(driver)
    if shift:
        actions.key_down(Keys.SHIFT)
    actions.move_to_element_with_offset(marks, round(x - size["width"] / 2),
                                        round(y - size["height"] / 2)).click()
    if shift:
        actions.key_up(Keys.SHIFT)
    actions.perform()


def test_clicks_and_box_show_the_predictors_mask(app_url, browser, models, tmp_path):
    open_sample(browser, app_url)
    height, width = sample_image().shape[:2]
    assert js(browser, "return [window.candleApp.width, window.candleApp.height]") == [width,
                                                                                         height]
    steps = [("click", (80, 120)), ("shift-click", (110, 200)), ("drag", (180, 60, 250, 175))]
    for n, (kind, where) in enumerate(steps, 1):
        if kind == "drag":
            marks = browser.find_element(By.ID, "marks")
            x1, y1, x2, y2 = where
            (ActionChains(browser)
             .move_to_element_with_offset(marks, x1 - width // 2, y1 - height // 2)
             .click_and_hold().move_by_offset(x2 - x1, y2 - y1).release().perform())
        else:
            click_at(browser, *where, shift=kind == "shift-click")
        wait_for(browser, f"window.candleApp.answered >= {n} && window.candleApp.pending === 0",
                 f"the mask after the {kind}")
        state = js(browser, "const s = window.candleApp; "
                            "return {points: s.points, labels: s.labels, box: s.box, "
                            "best: s.result.best, chosen: s.chosen};")
        if kind == "drag":  # the box spans the drag, in image pixels
            np.testing.assert_allclose(state["box"], where, atol=1.5)
        else:  # the point is where the mouse clicked; Shift makes it a background point
            np.testing.assert_allclose(state["points"][-1], where, atol=1.5)
            assert state["labels"][-1] == (0 if kind == "shift-click" else 1)
        expected, best = predictor_mask(models["sam"], state["points"], state["labels"],
                                        state["box"])
        assert state["best"] == state["chosen"] == best
        assert_same_mask(page_mask(browser), expected)
        message = js(browser, "return document.getElementById('message').textContent")
        assert "predicted IoU" in message
        if n == 1:
            browser.save_screenshot(str(screenshot_dir(tmp_path) / "app-segment.png"))
    assert js(browser, "return document.querySelectorAll('#candidates button').length") == 3
    check_downloads(browser, expected, sample_image())


def check_downloads(driver, mask: np.ndarray, rgb: np.ndarray) -> None:
    """The three download buttons give the shown mask as a PNG, the overlay (image, mask, prompts)
    as a PNG and the masks as COCO RLE that decode to the same mask."""
    import base64
    import io
    import json

    from PIL import Image
    from pycocotools import mask as mask_utils

    # catch what the buttons hand to the browser's download: data: URLs and Blobs
    js(driver, "window.downloads = {}; window.blobs = {}; "
               "HTMLAnchorElement.prototype.click = function () { "
               "  window.downloads[this.download] = this.href; }; "
               "const make = URL.createObjectURL; "
               "URL.createObjectURL = (b) => { const u = make(b); window.blobs[u] = b; "
               "  return u; };")
    for button in ("dl-mask", "dl-overlay", "dl-json"):
        driver.find_element(By.ID, button).click()
    files = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        Promise.all(Object.entries(window.downloads).map(async ([name, href]) =>
          [name, href.startsWith('blob:') ? 'text:' + await window.blobs[href].text() : href]
        )).then((pairs) => done(Object.fromEntries(pairs)), (e) => done(String(e)));""")
    assert isinstance(files, dict) and sorted(files) == ["mask.png", "masks.json",
                                                          "overlay.png"], files
    data = {name: (href[5:].encode() if href.startswith("text:")
                   else base64.b64decode(href.split("base64,", 1)[1]))
            for name, href in files.items()}
    png = np.asarray(Image.open(io.BytesIO(data["mask.png"])).convert("L")) > 127
    assert_same_mask(png, mask)
    overlay = np.asarray(Image.open(io.BytesIO(data["overlay.png"])).convert("RGB"))
    assert overlay.shape == rgb.shape
    shown = page_mask(driver)
    outside = ~shown & ~page_marks(driver)  # neither mask nor prompts: the image as shown (JPEG)
    diff = np.abs(overlay[outside].astype(int) - rgb[outside]).max(axis=1)
    # JPEG's 4:2:0 chroma blurs the sample's sharp colour edges: a few pixels differ a lot
    assert np.median(diff) <= 2 and diff.mean() <= 6, (np.median(diff), diff.mean())
    assert np.abs(overlay[shown].astype(int) - rgb[shown]).mean() > 20  # tinted
    doc = json.loads(data["masks.json"])
    best = next(m for m in doc["masks"] if m["best"])
    rle = {"size": best["segmentation"]["size"], "counts": best["segmentation"]["counts"].encode()}
    assert_same_mask(mask_utils.decode(rle).astype(bool), mask)
    assert doc["prompts"]["points"] and doc["prompts"]["box"]


def page_marks(driver) -> np.ndarray:
    """The prompt layer's drawn pixels, ``(H, W)`` bool."""
    h, w, s = js(driver, """
        const c = document.getElementById('marks');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let s = '';
        for (let i = 3; i < d.length; i += 4) s += d[i] > 0 ? '1' : '0';
        return [c.height, c.width, s];""")
    return (np.frombuffer(s.encode(), dtype=np.uint8) == ord("1")).reshape(h, w)


def test_corrupt_upload_is_a_message_in_the_page(app_url, browser, tmp_path):
    browser.get(app_url + "/")
    wait_for(browser, "window.candleApp && window.candleApp.info", "the models' info")
    bad = tmp_path / "holiday.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not really a JPEG" * 20)
    browser.find_element(By.ID, "file").send_keys(str(bad))
    message = wait_for(browser, "document.getElementById('message').className === 'error' "
                                "&& document.getElementById('message').textContent",
                       "an error message")
    assert message.startswith("holiday.jpg: upload: not a readable image"), message
    assert "Traceback" not in browser.page_source
    assert js(browser, "return window.candleApp.image") is None


def test_segment_everything_draws_the_generators_masks(app_url, browser, models):
    from candle_nn_models.segment_anything import SamAutomaticMaskGenerator

    open_sample(browser, app_url)
    knobs = {"points_per_side": 3, "pred_iou_thresh": 0, "stability_score_thresh": 0,
             "min_mask_region_area": 0}
    for name, value in knobs.items():
        js(browser, f"document.getElementById('{name}').value = '{value}'")
    browser.find_element(By.ID, "everything").click()
    assert js(browser, "return !document.getElementById('progress').hidden")
    wait_for(browser, "window.candleApp.everything && window.candleApp.pending === 0",
             "segment everything's masks")
    records = SamAutomaticMaskGenerator(models["sam"], **knobs).generate(sample_image())
    assert records, "the knobs must leave masks to compare"
    count = js(browser, "return window.candleApp.everything.masks.length")
    assert count == len(records)
    union = np.logical_or.reduce([r["segmentation"] for r in records])
    assert_same_mask(page_mask(browser), union)
    assert f"{count} masks from 9 points" in js(
        browser, "return document.getElementById('message').textContent")


def test_detect_and_classify_views(app_url, browser, models, tmp_path):
    from candle_nn_models.scripts.resnet import top_k_probabilities
    from candle_nn_models.imagenet import preprocess

    open_sample(browser, app_url)
    browser.find_element(By.CSS_SELECTOR, "button.tab[data-view=detect]").click()
    wait_for(browser, "window.candleApp.detect && window.candleApp.pending === 0",
             "the first detections")
    js(browser, "const c = document.getElementById('conf'); c.value = '0.75'; "
                "c.dispatchEvent(new Event('input')); c.dispatchEvent(new Event('change'));")
    detections = wait_for(browser, "window.candleApp.detect.conf === 0.75 && "
                                   "window.candleApp.pending === 0 && "
                                   "window.candleApp.detect.detections", "the detections at 0.75")
    (result,) = models["detect"].predict(sample_image(), conf=0.75, iou=0.7)
    expected = result.detections
    assert expected, "the threshold must leave detections to compare"
    assert [d["class_id"] for d in detections] == [d.class_id for d in expected]
    np.testing.assert_allclose([d["box_xyxy"] for d in detections],
                               [d.box_xyxy for d in expected], atol=0.02)
    assert js(browser, "return document.getElementById('detect-image').naturalWidth") == 320
    browser.save_screenshot(str(screenshot_dir(tmp_path) / "app-detect.png"))

    browser.find_element(By.CSS_SELECTOR, "button.tab[data-view=classify]").click()
    top = wait_for(browser, "window.candleApp.classify && window.candleApp.pending === 0 && "
                            "window.candleApp.classify.top_k", "the classes")
    classifier, labels = models["classify"]
    want = top_k_probabilities(classifier, preprocess(sample_image())[None], 5)[0]
    assert [t["label"] for t in top] == [labels[i] for i, _ in want]
    np.testing.assert_allclose([t["probability"] for t in top], [p for _, p in want], atol=1e-5)
    rows = js(browser, "return document.querySelectorAll('#classify-table tr').length")
    assert rows == 1 + len(want)
    browser.save_screenshot(str(screenshot_dir(tmp_path) / "app-classify.png"))
