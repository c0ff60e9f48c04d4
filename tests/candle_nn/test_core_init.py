"""Seeded initialisation: reproducible (in-process, across processes, whatever device's stream is
current), distinct per variable, with the requested Kaiming statistics and candle's defaults."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from conftest import ROOT

import candle_nn as cn
from candle_nn.init import Const, Kaiming, Normal, Uniform, calculate_gain, fans, variable_key


class TwoLayers(cn.Module):
    """Two Linear layers of the same shape and a conv: the candle Metal bug gave equal biases."""

    def __init__(self, a: cn.Linear, b: cn.Linear, conv: cn.Conv2d) -> None:
        super().__init__(a.device)
        self.a, self.b, self.conv = a, b, conv

    @classmethod
    def load(cls, vb: cn.VarBuilder) -> "TwoLayers":
        return cls(cn.Linear.load(vb.pp("a"), 16, 16), cn.Linear.load(vb.pp("b"), 16, 16),
                   cn.Conv2d.load(vb.pp("conv"), 8, 16, 3))

    def forward(self, x: mx.array) -> mx.array:
        return self.b(self.a(x))


def init_values(seed: int, device: cn.Device | None = None,
                dtype: mx.Dtype = mx.float32) -> dict[str, np.ndarray]:
    varmap = cn.VarMap()
    TwoLayers.load(cn.VarBuilder.from_varmap(varmap, seed=seed, device=device or cn.Device.cpu(),
                                        dtype=dtype))
    return {k: np.array(v.astype(mx.float32)) for k, v in varmap.all_vars().items()}


def digest(values: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(values):
        h.update(k.encode() + np.ascontiguousarray(values[k], np.float32).tobytes())
    return h.hexdigest()


def test_same_seed_same_values():
    first, second = init_values(5), init_values(5)
    assert first.keys() == second.keys() and len(first) == 6
    for k in first:
        np.testing.assert_array_equal(first[k], second[k], err_msg=k)


def test_other_seed_other_values():
    first, other = init_values(5), init_values(6)
    for k in first:
        assert not np.array_equal(first[k], other[k]), k


SUBPROCESS = """
import sys
sys.path[:0] = [{here!r}, {tests!r}]
from test_core_init import digest, init_values
print(digest(init_values(5)))
"""


def test_same_seed_same_values_across_processes():
    code = SUBPROCESS.format(here=str(Path(__file__).resolve().parent), tests=str(ROOT / "tests"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == digest(init_values(5))


def test_every_variable_has_its_own_stream():
    values = init_values(5)
    # same shape, same init, different layers: never equal (candle's Metal bug)
    assert not np.array_equal(values["a.weight"], values["b.weight"])
    assert not np.array_equal(values["a.bias"], values["b.bias"])
    # different parameters of one layer are not slices of one stream either
    assert not np.array_equal(values["a.bias"], values["a.weight"][0])
    assert not np.array_equal(values["a.bias"], values["a.weight"].ravel()[-16:])
    # and no value is repeated across the tensors
    allv = np.concatenate([v.ravel() for v in values.values()])
    assert len(np.unique(allv)) == allv.size


def test_variable_key_depends_on_seed_and_full_path():
    keys = {(s, p): np.array(variable_key(s, p)).tobytes()
            for s in (0, 1) for p in ("a.weight", "b.weight", "a.weightx", "weight")}
    assert len(set(keys.values())) == len(keys)
    np.testing.assert_array_equal(np.array(variable_key(3, "x")), np.array(variable_key(3, "x")))


def test_prefix_is_part_of_the_stream():
    def bias(prefix: str) -> np.ndarray:
        varmap = cn.VarMap()
        cn.Linear.load(cn.VarBuilder.from_varmap(varmap, seed=0, device="cpu").pp(prefix), 4, 4)
        return np.array(varmap[f"{prefix}.bias"])

    assert not np.array_equal(bias("x"), bias("y"))
    np.testing.assert_array_equal(bias("x"), bias("x"))


def test_same_values_whatever_stream_is_current():
    """Sampling must not depend on the current default device/stream, nor on the VarBuilder's
    device: compare under every available device."""
    reference = init_values(9, cn.Device.cpu())
    init = cn.Init.kaiming_uniform()
    key = variable_key(9, "probe")
    base = np.array(init.sample((32, 32), key))
    for device in cn.Device.available():
        with mx.stream(device.stream):
            np.testing.assert_array_equal(np.array(init.sample((32, 32), key)), base)
            got = init_values(9, cn.Device.cpu())
        for k in reference:
            np.testing.assert_array_equal(got[k], reference[k], err_msg=f"{device}: {k}")
        got = init_values(9, device)
        for k in reference:
            np.testing.assert_array_equal(got[k], reference[k], err_msg=f"{device}: {k}")


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
def test_half_precision_values_are_the_float32_draw_rounded(dtype):
    full = init_values(4)
    half = init_values(4, dtype=dtype)
    for k in full:
        np.testing.assert_array_equal(
            half[k], np.array(mx.array(full[k]).astype(dtype).astype(mx.float32)), err_msg=k)


# -- statistics ----------------------------------------------------------------------------------
SHAPE = (256, 64, 3, 3)  # conv (O, I, kH, kW): fan_in 576, fan_out 2304 -> 147k samples


def draw(init: cn.Init, shape=SHAPE, seed: int = 0) -> np.ndarray:
    return np.array(init.sample(shape, variable_key(seed, "stats"))).astype(np.float64)


def test_fans_of_candle_layouts():
    assert fans((256, 64, 3, 3)) == (576, 2304)
    assert fans((10, 20)) == (20, 10)
    assert fans((7,)) == (7, 7)


def test_gains():
    assert calculate_gain("relu") == pytest.approx(math.sqrt(2))
    assert calculate_gain("linear") == calculate_gain("sigmoid") == 1.0
    assert calculate_gain("tanh") == pytest.approx(5 / 3)
    assert calculate_gain("leaky_relu", 0.2) == pytest.approx(math.sqrt(2 / 1.04))
    with pytest.raises(ValueError, match="nonlinearity"):
        calculate_gain("softplus")


@pytest.mark.parametrize("fan", ["in", "out"])
@pytest.mark.parametrize("nonlinearity", ["relu", "linear", "tanh"])
def test_kaiming_normal_statistics(fan, nonlinearity):
    gain = {"relu": math.sqrt(2), "linear": 1.0, "tanh": 5 / 3}[nonlinearity]
    std = gain / math.sqrt(576 if fan == "in" else 2304)
    x = draw(cn.Init.kaiming_normal(fan, nonlinearity))
    assert x.shape == SHAPE
    assert abs(x.mean()) < 0.01 * std
    assert x.std() == pytest.approx(std, rel=0.01)
    # normal, not uniform: about 4.6% of samples beyond 2 std, excess kurtosis ~0
    assert np.mean(np.abs(x) > 2 * std) == pytest.approx(0.0455, abs=0.003)


@pytest.mark.parametrize("fan", ["in", "out"])
@pytest.mark.parametrize("nonlinearity", ["relu", "linear", "tanh"])
def test_kaiming_uniform_statistics(fan, nonlinearity):
    gain = {"relu": math.sqrt(2), "linear": 1.0, "tanh": 5 / 3}[nonlinearity]
    bound = gain * math.sqrt(3 / (576 if fan == "in" else 2304))
    x = draw(cn.Init.kaiming_uniform(fan, nonlinearity))
    assert np.abs(x).max() <= bound
    assert np.abs(x).max() > 0.999 * bound
    assert abs(x.mean()) < 0.01 * bound
    assert x.std() == pytest.approx(bound / math.sqrt(3), rel=0.01)
    hist, _ = np.histogram(x, bins=10, range=(-bound, bound))
    assert hist.min() > 0.95 * x.size / 10  # flat


def test_plain_initialisers():
    x = draw(cn.Init.normal(2.0, 0.5))
    assert x.mean() == pytest.approx(2.0, abs=0.005) and x.std() == pytest.approx(0.5, rel=0.01)
    x = draw(cn.Init.uniform(-0.25, 0.75))
    assert x.min() >= -0.25 and x.max() < 0.75
    assert x.mean() == pytest.approx(0.25, abs=0.005)
    assert x.std() == pytest.approx(1 / math.sqrt(12), rel=0.01)
    assert (draw(cn.Init.const(3.5), (4, 5)) == 3.5).all()


# -- defaults of the layers ----------------------------------------------------------------------
def fresh(build, seed: int = 0) -> dict[str, np.ndarray]:
    varmap = cn.VarMap()
    build(cn.VarBuilder.from_varmap(varmap, seed=seed, device="cpu"))
    return {k: np.array(v).astype(np.float64) for k, v in varmap.all_vars().items()}


def test_linear_defaults_as_candle():
    v = fresh(lambda vb: cn.Linear.load(vb, 400, 300))
    bound = 1 / math.sqrt(400)
    assert np.abs(v["bias"]).max() <= bound and np.abs(v["bias"]).max() > 0.98 * bound
    assert v["weight"].std() == pytest.approx(math.sqrt(2 / 400), rel=0.01)  # Kaiming normal
    assert np.abs(v["weight"]).max() > 3 * math.sqrt(2 / 400)  # a normal's tails, not uniform
    assert v["weight"].shape == (300, 400) and v["bias"].shape == (300,)


def test_conv2d_defaults():
    v = fresh(lambda vb: cn.Conv2d.load(vb, 64, 256, 3))
    fan_in = 64 * 9
    assert v["weight"].shape == SHAPE  # stored in candle layout in the VarMap
    assert v["weight"].std() == pytest.approx(math.sqrt(2 / fan_in), rel=0.01)
    assert np.abs(v["bias"]).max() <= 1 / math.sqrt(fan_in)
    assert np.abs(v["bias"]).max() > 0.9 / math.sqrt(fan_in)
    v = fresh(lambda vb: cn.Conv2d.load(vb, 64, 64, 3, cn.Conv2dConfig(groups=64)))  # depthwise
    assert v["weight"].shape == (64, 1, 3, 3)
    assert np.abs(v["bias"]).max() <= 1 / 3


def test_norm_and_embedding_defaults():
    v = fresh(lambda vb: (cn.BatchNorm2d.load(vb.pp("bn"), 8), cn.LayerNorm.load(vb.pp("ln"), 8),
                          cn.Embedding.load(vb.pp("emb"), 1000, 100)))
    assert (v["bn.running_mean"] == 0).all() and (v["bn.running_var"] == 1).all()
    assert (v["bn.weight"] == 1).all() and (v["bn.bias"] == 0).all()
    assert (v["ln.weight"] == 1).all() and (v["ln.bias"] == 0).all()
    assert v["emb.weight"].std() == pytest.approx(1.0, rel=0.01)


def test_get_with_explicit_init_and_varbuilder_defaults():
    v = fresh(lambda vb: (vb.get((3, 3), "c", cn.Init.const(0.5)), vb.get((500, 400), "w"),
                          vb.get((7,), "b")))
    assert (v["c"] == 0.5).all()
    assert v["w"].std() == pytest.approx(math.sqrt(2 / 400), rel=0.01)  # Kaiming normal
    assert (v["b"] == 0).all()  # 1-D without init: zeros


def test_init_constructors_give_named_fields():
    assert cn.Init.const(3) == Const(value=3.0)
    assert cn.Init.normal(2, 0.5) == Normal(mean=2.0, std=0.5)
    assert cn.Init.uniform(-0.25, 0.75) == Uniform(lo=-0.25, hi=0.75)
    assert cn.Init.kaiming_uniform("out", "tanh") == Kaiming("uniform", fan="out",
                                                             nonlinearity="tanh")
    assert cn.Init.kaiming_normal().std((300, 400)) == pytest.approx(math.sqrt(2 / 400))


# Recorded with MLX 0.32.4 (pinned) on Linux x86_64. All but Linear's are what candle_nn drew
# before Init became named dataclasses (commit 4227405; both trees run side by side gave the same
# digests); that commit deliberately moved Linear's weight to Kaiming normal, as candle's `linear`.
# A change that alters any seeded draw, even by one bit, fails here and has to say so.
SEEDED_DIGESTS = {
    "bn.bias": "38723a2e5e8a17aa", "bn.running_mean": "38723a2e5e8a17aa",
    "bn.running_var": "b638277a8690e175", "bn.weight": "b638277a8690e175",
    "conv.bias": "ce0e6c8dd23f86d6", "conv.weight": "b5b9f0c95506aac5",
    "dw.bias": "7fe1873066dc4e24", "dw.weight": "bd5bbfb0615e1741",
    "emb.weight": "041080dfaaf0d62f",
    "ln.bias": "38723a2e5e8a17aa", "ln.weight": "b638277a8690e175",
    "explicit.const": "5861fa05b39a472f", "explicit.default2d": "682c77c2d72ea9df",
    "explicit.kn": "66b6d5c5eb1d78cb", "explicit.ku": "c5705c46a754df93",
    "explicit.normal": "683d8409ea877ac4", "explicit.uniform": "48334d1757ca8f20",
    "lin.bias": "b06bfa26e18f7ede", "lin.weight": "4f5ddd6ebf0e6a56",
}


def test_seeded_values_are_pinned_bit_for_bit():
    varmap = cn.VarMap()
    vb = cn.VarBuilder.from_varmap(varmap, seed=7, device="cpu")
    cn.Conv2d.load(vb.pp("conv"), 16, 32, 3)
    cn.Conv2d.load(vb.pp("dw"), 32, 32, 3, cn.Conv2dConfig(groups=32))
    cn.BatchNorm2d.load(vb.pp("bn"), 32)
    cn.LayerNorm.load(vb.pp("ln"), 32)
    cn.Embedding.load(vb.pp("emb"), 50, 8)
    cn.Linear.load(vb.pp("lin"), 12, 6)
    for name, init in [("const", cn.Init.const(0.5)), ("normal", cn.Init.normal(1.0, 2.0)),
                       ("uniform", cn.Init.uniform(-0.5, 0.25)),
                       ("kn", cn.Init.kaiming_normal("out", "tanh")),
                       ("ku", cn.Init.kaiming_uniform("in", "relu"))]:
        vb.get((24, 12, 3, 3), f"explicit.{name}", init)
    vb.get((24, 12), "explicit.default2d")
    got = {k: hashlib.sha256(np.array(v).tobytes()).hexdigest()[:16]
           for k, v in varmap.all_vars().items()}
    assert got == SEEDED_DIGESTS
