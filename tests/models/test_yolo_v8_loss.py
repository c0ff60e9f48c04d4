"""YOLOv8's detection loss and assigner against ultralytics (the ``yolov8n_loss`` fixture: two
640×640 images, five boxes), under ``mx.compile``, and its gradient against PyTorch autograd of
ultralytics' formulas (written out below, in float64)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import candle_nn as cn
import mlx.core as mx
import mlx.nn as nn
from candle_nn.checkpoint import state_dict
from candle_nn_models.yolo_v8_boxes import bbox_ciou
from candle_nn_models.yolo_v8 import YoloV8
from candle_nn_models.yolo_v8_loss import DetectionLoss
from helpers.cli import cli_env
from helpers.yolo_loss_reference import feats_of, rel_l2, torch_ciou, torch_loss
from conftest import FIXTURES, assert_matches, load_fixture

@pytest.fixture(scope="module")
def fixture():
    io, meta, _ = load_fixture("yolov8n_loss")
    return io, meta


def _check(meta: dict, key: str, candidate, reference) -> None:
    """The fixture's max-abs tolerance and, for the losses, its relative-L2 one."""
    assert_matches(meta, key, candidate, reference)
    if key.startswith("loss"):
        tol = meta["tolerance"][key]["rtol_l2"]
        assert rel_l2(candidate, reference) <= tol, (key, rel_l2(candidate, reference), tol)


def test_assigner_and_loss_match_ultralytics(fixture, device) -> None:
    io, meta = fixture
    criterion = DetectionLoss(80, device=device)
    feats, targets = feats_of(io), io["input.targets"]
    with criterion.on_device():
        pred = criterion.predictions(feats)
        t = criterion.assign(pred, criterion.ground_truth(pred, targets))
    assert np.array_equal(np.array(t.fg_mask), io["output.fg_mask"] > 0)
    assert np.array_equal(np.array(t.target_gt_idx), io["output.target_gt_idx"])
    _check(meta, "target_bboxes", t.target_bboxes, io["output.target_bboxes"])
    _check(meta, "target_scores", t.target_scores, io["output.target_scores"])
    loss, items = criterion(feats, targets)
    _check(meta, "loss_items", items, io["output.loss_items"])
    _check(meta, "loss", np.array(loss).reshape(1), io["output.loss"])


def test_compiled_gives_the_same_numbers(fixture, device) -> None:
    io, _ = fixture
    criterion = DetectionLoss(80, device=device)
    feats, targets = feats_of(io), mx.array(io["input.targets"])
    eager_loss, eager_items = criterion(feats, targets)
    compiled = mx.compile(lambda p3, p4, p5, t: criterion([p3, p4, p5], t))
    loss, items = compiled(*feats, targets)
    np.testing.assert_allclose(np.array(items), np.array(eager_items), rtol=1e-5)
    np.testing.assert_allclose(float(loss), float(eager_loss), rtol=1e-5)


def test_padding_rows_and_row_order_change_nothing(fixture) -> None:
    io, _ = fixture
    criterion = DetectionLoss(80)
    feats, targets = feats_of(io), io["input.targets"]
    _, items = criterion(feats, targets)
    # Rows of both images interleaved, plus two padding rows (image index -1).
    shuffled = np.concatenate([targets[[3, 0, 4, 1, 2]], np.full((2, 6), -1, np.float32)])
    _, again = criterion(feats, mx.array(shuffled))
    np.testing.assert_allclose(np.array(again), np.array(items), rtol=1e-6)


def test_no_boxes_learns_background_only(fixture) -> None:
    io, _ = fixture
    feats = feats_of(io)
    loss, items = DetectionLoss(80)(feats, np.zeros((0, 6), np.float32))
    x = io["output.scores"].astype(np.float64)
    bce = np.logaddexp(0, x).sum() * 0.5  # all-zero targets; divided by max(0, 1) = 1
    np.testing.assert_allclose(np.array(items), [0, bce, 0], rtol=1e-5)
    np.testing.assert_allclose(float(loss), 2 * bce, rtol=1e-5)


@pytest.mark.parametrize("bad, fragment", [
    (np.zeros((2, 5), np.float32), "expected (n, 6)"),
    (np.array([[2, 0, .5, .5, .1, .1]], np.float32), "row 0"),  # image 2 of a batch of 2
    (np.array([[0, 0, .5, .5, .1, .1], [1, 80, .5, .5, .1, .1]], np.float32), "row 1"),
    (np.array([[0, 0, .5, np.nan, .1, .1]], np.float32), "finite box"),
    (np.array([[0, 0, .5, .5, .1, .1], [1, -1, .5, .5, .1, .1]], np.float32), "row 1"),
    (np.array([[0, 0, 320, 320, 64, 64]], np.float32), "normalised"),  # pixels, not 0..1
])
@pytest.mark.parametrize("kind", ["numpy", "mx.array"])
def test_bad_targets_are_named(fixture, bad, fragment, kind) -> None:
    """NumPy and (eager) ``mx.array`` targets are checked alike: out-of-range image indices and
    classes, non-finite and pixel (unnormalised) boxes are one ValueError naming the row."""
    io, _ = fixture
    with pytest.raises(ValueError, match="targets") as err:
        DetectionLoss(80)(feats_of(io), bad if kind == "numpy" else mx.array(bad))
    assert fragment in str(err.value)


@pytest.mark.parametrize("bad", ["nan", "inf", "class", "image"])
def test_bad_targets_under_compile_are_dropped_not_a_crash(bad) -> None:
    """Under ``mx.compile`` the targets cannot be read back to be checked (the trainer checks
    them before): a row with a NaN or infinite coordinate, a class or an image index out of
    range is dropped on the device, as padding, and the loss is the one without it. Run in a
    child process: a NaN coordinate once crashed Python (SIGSEGV)."""
    code = f"""if True:
        import candle_nn, mlx.core as mx, numpy as np
        from candle_nn_models.yolo_v8_loss import DetectionLoss
        feats = [mx.random.normal((2, s, s, 66), key=mx.random.key(i))
                 for i, s in enumerate((8, 4, 2))]
        good = np.array([[0, 0, .5, .5, .4, .4], [1, 1, .3, .3, .2, .2]], np.float32)
        bad = np.array([[0, 1, .5, .5, .3, .3]], np.float32)
        col, value = {{"nan": (2, np.nan), "inf": (5, np.inf), "class": (1, 2),
                       "image": (0, 2)}}[{bad!r}]
        bad[0, col] = value
        padding = np.array([[-1, 0, 0, 0, 0, 0]], np.float32)
        loss = mx.compile(lambda p3, p4, p5, t: DetectionLoss(2)([p3, p4, p5], t)[1])
        for rows, same_as in ((bad, padding), (np.concatenate([good, bad]), good)):
            got = np.array(loss(*feats, mx.array(rows)))
            assert np.isfinite(got).all(), got
            np.testing.assert_allclose(got, np.array(loss(*feats, mx.array(same_as))),
                                       rtol=1e-6)
        print("ok")
    """
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120,
                            env=cli_env())
    assert result.returncode == 0 and result.stdout == b"ok\n", result.stderr.decode()[-2000:]


def test_ciou_matches_the_formula() -> None:
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 50, (2, 64, 2))
    wh = rng.uniform(0.5, 30, (2, 64, 2))
    boxes = np.concatenate([xy, xy + wh], axis=-1)  # (2, 64, 4): two sets of 64 boxes
    got = np.array(bbox_ciou(mx.array(boxes[0].astype(np.float32)),
                             mx.array(boxes[1].astype(np.float32))))
    ref = torch_ciou(torch.from_numpy(boxes[0]), torch.from_numpy(boxes[1])).numpy()
    np.testing.assert_allclose(got, ref, atol=2e-6)
    assert np.allclose(np.array(bbox_ciou(mx.array(boxes[0]), mx.array(boxes[0]))), 1, atol=1e-6)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_ciou_gradient_at_touching_and_equal_edges_is_torchs(compiled) -> None:
    """Where boxes share an edge or just touch, ultralytics' ``minimum``/``maximum`` split the
    gradient of a tie in half and ``clamp(0)`` passes it at 0; MLX's own ops give a tie's whole
    gradient to one side and none at 0. Identical, edge-sharing, touching, nested boxes."""
    b1 = np.array([[0, 0, 2, 2], [0, 0, 2, 2], [0, 0, 1, 1], [1, 1, 3, 4], [2, 3, 5, 7],
                   [0, 0, 4, 4]], np.float32)
    b2 = np.array([[0, 0, 2, 2], [2, 0, 4, 2], [0, 0, 2, 1], [1, 0.5, 3, 4], [5, 3, 6, 7],
                   [1, 1, 4, 3]], np.float32)
    grad = mx.grad(lambda a, b: bbox_ciou(a, b).sum(), argnums=(0, 1))
    got = (mx.compile(grad) if compiled else grad)(mx.array(b1), mx.array(b2))
    t1, t2 = (torch.tensor(b, dtype=torch.float64, requires_grad=True) for b in (b1, b2))
    torch_ciou(t1, t2).sum().backward()
    for g, t in zip(got, (t1, t2)):
        np.testing.assert_allclose(np.array(g), t.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(bbox_ciou(mx.array(b1), mx.array(b2))),
                               torch_ciou(t1, t2).detach().numpy(), rtol=1e-6, atol=1e-6)


def test_gradient_matches_torch_autograd(fixture, device) -> None:
    io, meta = fixture
    boxes = torch.from_numpy(io["output.boxes"]).double().requires_grad_()
    scores = torch.from_numpy(io["output.scores"]).double().requires_grad_()
    ref_loss, ref_items = torch_loss(boxes, scores, io)
    ref_loss.backward()
    _check(meta, "loss_items", ref_items.detach().numpy(), io["output.loss_items"])

    criterion, targets = DetectionLoss(80, device=device), mx.array(io["input.targets"])
    grads = mx.grad(lambda fs: criterion(fs, targets)[0])(feats_of(io))
    flat = np.concatenate([np.array(g).reshape(2, -1, 144) for g in grads], axis=1)
    for name, got, ref in [("boxes", flat[..., :64], boxes.grad), ("scores", flat[..., 64:],
                                                                   scores.grad)]:
        ref = ref.numpy().transpose(0, 2, 1)
        err = rel_l2(got, ref)
        assert err <= 1e-5, f"d loss / d {name}: relative L2 error {err:.2e}"
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max(), name


def test_bad_feature_maps_are_named(fixture) -> None:
    io, _ = fixture
    criterion = DetectionLoss(80)
    feats = feats_of(io)
    with pytest.raises(ValueError, match="3 feature maps for 2 strides"):
        DetectionLoss(80, strides=(8, 16))(feats, io["input.targets"])
    with pytest.raises(ValueError, match="expected"):
        criterion([f[..., :100] for f in feats], io["input.targets"])


def test_train_mode_model_loss_and_gradients_match_ultralytics(fixture, device) -> None:
    """The whole step as ultralytics trains: YOLOv8n with BatchNorm on batch statistics
    (``fold_bn=False``, ``train()``), its raw maps into the loss, d loss / d parameters."""
    io, meta = fixture
    folder = FIXTURES / "yolov8n_loss"
    vb = cn.VarBuilder.from_safetensors(folder / "weights.safetensors", device=device)
    model = YoloV8.load(vb, "n", num_classes=80, fold_bn=False).train()
    criterion = DetectionLoss(80, device=device)
    x = mx.array(io["input.image"].transpose(0, 2, 3, 1))
    targets = mx.array(io["input.targets"])
    start = model.parameters()

    def loss_fn(model, x, targets):
        return criterion(model(x), targets)

    loss_and_grad = nn.value_and_grad(model, lambda m, x, t: loss_fn(m, x, t)[0])
    (loss, items) = loss_fn(model, x, targets)
    stats = {k: np.array(v) for k, v in state_dict(model).items()}  # after one forward
    _check(meta, "loss_items", items, io["output.loss_items"])
    _check(meta, "loss", np.array(loss).reshape(1), io["output.loss"])
    model.update(start)  # that forward moved the running statistics
    loss, grads = loss_and_grad(model, x, targets)
    mx.eval(loss, grads)
    model.update(grads)  # name the gradients as the weights (candle names, PyTorch layout)
    named = {k: np.array(v) for k, v in state_dict(model).items()}
    checked = 0
    for key in meta["tolerance"]:
        kind, _, name = key.partition(".")
        if kind not in ("grad", "after"):
            continue
        got, ref = (named if kind == "grad" else stats)[name], io[f"output.{key}"]
        err, tol = rel_l2(got, ref), meta["tolerance"][key]["rtol_l2"]
        assert err <= tol, f"{key}: relative L2 error {err:.3e} > tolerance {tol:.1e}"
        checked += 1
    assert checked == 9


def test_slots_per_image_change_nothing(fixture) -> None:
    io, _ = fixture
    criterion, feats, targets = DetectionLoss(80), feats_of(io), io["input.targets"]
    pred = criterion.predictions(feats)
    assert criterion.ground_truth(pred, targets).bboxes.shape == (2, 8, 4)  # 3 rounded up to 8
    assert criterion.ground_truth(pred, mx.array(targets)).bboxes.shape == (2, 5, 4)  # n
    _, items = criterion(feats, targets)
    for t, m in ((targets, None), (targets, 3), (mx.array(targets), 3), (mx.array(targets), 9)):
        np.testing.assert_allclose(np.array(criterion(feats, t, m)[1]), np.array(items),
                                   rtol=1e-6)
    with pytest.raises(ValueError, match="max_boxes 2: an image of this batch has 3 boxes"):
        criterion(feats, targets, 2)


def test_float16_maps_give_float32_losses(fixture) -> None:
    io, _ = fixture
    criterion = DetectionLoss(80)
    feats = feats_of(io)
    _, items = criterion(feats, io["input.targets"])
    half = [f.astype(mx.float16) for f in feats]
    loss, items16 = criterion(half, io["input.targets"])
    assert loss.dtype == mx.float32
    np.testing.assert_allclose(np.array(items16), np.array(items), rtol=2e-3)  # inputs rounded
    grads = mx.grad(lambda fs: criterion(fs, io["input.targets"])[0])(half)
    assert all(g.dtype == mx.float16 and np.isfinite(np.array(g)).all() for g in grads)
