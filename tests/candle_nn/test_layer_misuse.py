"""Library misuse gets one clear CandleNNError, the same with the fast paths on and off: wrong
input rank or channel count into a layer, a Module subclass that skipped ``super().__init__``,
an out-of-range embedding id, a BatchNorm with a non-finite ``eps`` or ``momentum``, a device
given as a string."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

import candle_nn as cn


def _vb(seed: int = 0) -> cn.VarBuilder:
    return cn.VarBuilder.from_varmap(cn.VarMap(), seed=seed, device="cpu")


def test_a_subclass_without_super_init_is_told_to_call_it() -> None:
    class Forgot(cn.Module):
        def __init__(self, head: cn.Linear) -> None:
            self.head = head

        def forward(self, x):
            return self.head(x)

    class ForgotAndSetNothing(cn.Module):
        def __init__(self) -> None:
            pass

        def forward(self, x):
            return x

    head = cn.Linear.load(_vb(), 4, 2)
    message = r"Forgot\.__init__ must call super\(\)\.__init__\(device\)"
    with pytest.raises(cn.CandleNNError, match=message):
        Forgot(head)
    with pytest.raises(cn.CandleNNError, match=message.replace("Forgot", "ForgotAndSetNothing")):
        ForgotAndSetNothing()(mx.zeros(3))


def test_modules_take_device_strings() -> None:
    class Net(cn.Module):
        def __init__(self, device) -> None:
            super().__init__(device)

    assert Net("cpu").device is cn.Device.cpu()
    with pytest.raises(cn.DeviceUnavailableError, match="bad device 'gpu:x'"):
        Net("gpu:x")


@pytest.mark.parametrize("ids", [[0, 3, 5], [-1, 2]], ids=["past_the_end", "negative"])
def test_embedding_refuses_ids_outside_its_table(ids) -> None:
    emb = cn.Embedding.load(_vb(), 5, 3)
    assert emb(mx.array([[0, 4], [2, 1]])).shape == (2, 2, 3)
    with pytest.raises(cn.CandleNNError, match=r"Embedding of 5 rows got id .* ids must be in "
                                               r"\[0, 5\)"):
        emb(mx.array(ids))
    with pytest.raises(cn.DTypeError, match="integer ids"):
        emb(mx.array([0.0, 1.0]))
    # inside mx.compile the values are unknown: the lookup runs unchecked
    assert mx.compile(emb)(mx.array([1, 2])).shape == (2, 3)


@pytest.mark.parametrize("field,value", [("eps", math.nan), ("eps", -1e-5), ("eps", math.inf),
                                         ("momentum", math.nan), ("momentum", 1.5),
                                         ("momentum", -0.1)])
def test_batch_norm_refuses_bad_eps_and_momentum(field, value) -> None:
    kwargs = {"eps": 1e-5, "momentum": 0.1, field: value}
    with pytest.raises(cn.CandleNNError, match=f"BatchNorm2d: {field}="):
        cn.BatchNorm2d.load(_vb(), 4, kwargs["eps"], kwargs["momentum"])
    with pytest.raises(cn.CandleNNError, match=f"BatchNorm2d: {field}="):
        cn.BatchNorm2d(mx.zeros(4), mx.ones(4), mx.ones(4), mx.zeros(4), kwargs["eps"],
                       momentum=kwargs["momentum"], device=cn.Device.cpu())


def _layers():
    vb = _vb(3)
    return {
        "conv": (cn.Conv2d.load(vb.pp("conv"), 4, 6, 3, cn.Conv2dConfig(padding=1)),
                 (1, 8, 8, 4), [((1, 8, 8, 3), r"Conv2d expects \(N, H, W, 4\) input, got "
                                               r"\(1, 8, 8, 3\)"),
                                ((8, 8, 4), r"Conv2d expects \(N, H, W, 4\) input, got "
                                            r"\(8, 8, 4\)")]),
        "depthwise": (cn.Conv2d.load(vb.pp("dw"), 4, 4, 3, cn.Conv2dConfig(padding=1, groups=4)),
                      (1, 8, 8, 4), [((1, 8, 8, 8), r"Conv2d expects \(N, H, W, 4\) input")]),
        "linear": (cn.Linear.load(vb.pp("lin"), 5, 2), (3, 5),
                   [((3, 4), r"Linear expects \(\.\.\., 5\) input, got \(3, 4\)"),
                    ((), r"Linear expects \(\.\.\., 5\) input, got \(\)")]),
        "max_pool": (cn.MaxPool2d(3, 2, 1), (1, 8, 8, 4),
                     [((8, 8, 4), r"MaxPool2d expects \(N, H, W, C\) input, got \(8, 8, 4\)"),
                      ((1, 0, 8, 4), r"MaxPool2d: a 3x3 window \(padding \(1, 1\)\) does not "
                                     r"fit the 8x0 input")]),
        "avg_pool": (cn.AvgPool2d(2), (1, 8, 8, 4),
                     [((8, 8, 4), r"AvgPool2d expects \(N, H, W, C\) input, got \(8, 8, 4\)")]),
        "layer_norm": (cn.LayerNorm.load(vb.pp("ln"), 6), (2, 6),
                       [((2, 5), r"LayerNorm expects \(\.\.\., 6\) input, got \(2, 5\)")]),
        "batch_norm": (cn.BatchNorm2d.load(vb.pp("bn"), 4), (1, 3, 3, 4),
                       [((1, 3, 3, 5), r"BatchNorm2d expects \(N, H, W, 4\) input, got "
                                       r"\(1, 3, 3, 5\)"),
                        ((3, 4), r"BatchNorm2d expects \(N, H, W, 4\) input, got \(3, 4\)")]),
    }


@pytest.mark.parametrize("name", list(_layers()))
def test_layer_misuse_is_one_message_whatever_the_path(name, op_paths) -> None:
    layer, good, bad = _layers()[name]
    assert layer(mx.zeros(good)).ndim == len(good)
    for shape, message in bad:
        with pytest.raises(cn.ShapeMismatchError, match=message):
            mx.eval(layer(mx.array(np.zeros(shape, np.float32))))
