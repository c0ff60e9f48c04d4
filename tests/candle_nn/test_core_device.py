"""Device discipline: value semantics and interning, parsing, unavailable GPUs, modules running on
their own device's stream, DeviceMismatchError on mixing devices, and ``module.to``.

On a machine without a GPU the mixing checks use a ``Device('gpu')`` object constructed with
``candle_nn.device._gpu_count`` patched; no op is run on it.
"""

from __future__ import annotations

import copy
import pickle

import mlx.core as mx
import numpy as np
import pytest

import candle_nn as cn
import candle_nn.device as cn_device
from conftest import HAS_GPU


# -- value semantics -----------------------------------------------------------------------------
def test_equal_requests_give_the_same_object():
    cpu = cn.Device.cpu()
    assert cpu is cn.Device.parse("cpu") is cn.Device("cpu") is cn.Device("cpu", 0)
    assert cpu is cn.Device.parse(" CPU ") is cn.Device.parse(cpu)
    assert copy.copy(cpu) is cpu and copy.deepcopy(cpu) is cpu
    assert pickle.loads(pickle.dumps(cpu)) is cpu


def test_equality_and_hash_are_by_kind_and_index():
    cpu = cn.Device.cpu()
    clone = object.__new__(cn.Device)  # a non-interned twin: still equal
    object.__setattr__(clone, "kind", "cpu")
    object.__setattr__(clone, "index", 0)
    assert clone is not cpu and clone == cpu and hash(clone) == hash(cpu)
    assert {cpu: 1}[clone] == 1
    assert len({cpu, clone, cn.Device.parse("cpu")}) == 1
    assert cpu != "cpu" and cpu != 0 and not (cpu == None)  # noqa: E711
    assert str(cpu) == "cpu" and repr(cpu) == "Device('cpu')"


def test_device_is_immutable():
    with pytest.raises(AttributeError, match="immutable"):
        cn.Device.cpu().kind = "gpu"


def test_cpu_stream_and_mlx_device():
    cpu = cn.Device.cpu()
    assert cpu.mx_device == mx.Device(mx.cpu, 0)
    assert cpu.stream is cpu.stream  # created once
    assert cpu.stream.device == mx.Device(mx.cpu, 0)


def test_parse_forms_of_the_cpu():
    for spec in ("cpu", "cpu:0", "CPU", " cpu:0 "):
        assert cn.Device.parse(spec) is cn.Device.cpu()


@pytest.mark.parametrize("spec", ["tpu", "gpu:x", "gpu:", "cpu:", "cpu:1", "gpu:-1", ":0", "",
                                  "gpu:0:1", "gpu: 0"])
def test_parse_errors(spec):
    with pytest.raises(cn.DeviceUnavailableError) as info:
        cn.Device.parse(spec)
    assert "cpu" in str(info.value) or "gpu" in str(info.value)


@pytest.mark.parametrize("spec,expected", [("cpu", ("cpu", 0)), ("GPU:3", ("gpu", 3)),
                                           (" cuda ", ("gpu", 0)), ("mps:1", ("gpu", 1))])
def test_parse_device_name_checks_spelling_not_presence(spec, expected):
    """The one alias parser (the benchmark lists devices this machine may lack)."""
    assert cn_device.parse_device_name(spec) == expected


@pytest.mark.parametrize("bad", [3, None, 1.5, ["cpu"]])
def test_parse_rejects_non_strings(bad):
    with pytest.raises(cn.DeviceUnavailableError, match="cannot parse device"):
        cn.Device.parse(bad)


def test_constructor_errors():
    with pytest.raises(cn.DeviceUnavailableError, match="unknown device kind 'tpu'"):
        cn.Device("tpu")
    with pytest.raises(cn.DeviceUnavailableError, match="invalid device index"):
        cn.Device("gpu", -1)
    with pytest.raises(cn.DeviceUnavailableError, match="invalid device index"):
        cn.Device("cpu", 1)


def test_available_and_default():
    available = cn.Device.available()
    assert available[0] is cn.Device.cpu()
    assert len(available) == 1 + cn_device._gpu_count()
    assert cn.Device.default() == (cn.Device.gpu(0) if HAS_GPU else cn.Device.cpu())


@pytest.mark.parametrize("spec", ["gpu", "gpu:0", "cuda", "metal", "mps", "GPU:0"])
def test_gpu_request(spec):
    if HAS_GPU:
        gpu = cn.Device.parse(spec)
        assert gpu is cn.Device.gpu(0) and str(gpu) == "gpu:0" and gpu.kind == "gpu"
        assert gpu.stream.device == mx.Device(mx.gpu, 0)
    else:
        with pytest.raises(cn.DeviceUnavailableError) as info:
            cn.Device.parse(spec)
        msg = str(info.value)
        assert "gpu:0 was requested" in msg and "no GPU" in msg
        assert "Device.cpu()" in msg and "--device cpu" in msg and "mlx[cuda]" in msg


def test_gpu_index_beyond_count_is_unavailable():
    index = cn_device._gpu_count()
    with pytest.raises(cn.DeviceUnavailableError, match=f"gpu:{index} was requested"):
        cn.Device.gpu(index)


# -- forward runs on the module's device ---------------------------------------------------------
class Probe(cn.Module):
    """Records the default device and stream in force while its forward runs."""

    def __init__(self, fc: cn.Linear) -> None:
        super().__init__(fc.device)
        self.fc = fc
        self.seen: list[tuple[mx.Device, mx.Stream]] = []

    @classmethod
    def load(cls, vb: cn.VarBuilder) -> "Probe":
        return cls(cn.Linear.load(vb.pp("fc"), 4, 3, bias=False))

    def forward(self, x: mx.array) -> mx.array:
        device = mx.default_device()
        self.seen.append((device, mx.default_stream(device)))
        return self.fc(x)


def probe_weights() -> dict[str, np.ndarray]:
    return {"fc.weight": np.arange(12, dtype=np.float32).reshape(3, 4) / 10}


def test_forward_runs_on_the_module_stream(device):
    model = Probe.load(cn.VarBuilder.from_tensors(probe_weights(), device=device))
    x = np.ones((2, 4), np.float32)
    y = model(mx.array(x))
    assert model.seen == [(device.mx_device, device.stream)]
    np.testing.assert_allclose(np.array(y), x @ probe_weights()["fc.weight"].T, rtol=1e-6)
    with model.on_device():
        assert mx.default_stream(mx.default_device()) == device.stream


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU: covered by test_cpu_module_uses_its_stream")
def test_cpu_module_runs_on_cpu_while_default_device_is_gpu():
    previous = mx.default_device()
    mx.set_default_device(mx.gpu)
    try:
        model = Probe.load(cn.VarBuilder.from_tensors(probe_weights(), device="cpu"))
        y = model(mx.array(np.ones((2, 4), np.float32)))
        mx.eval(y)
        assert model.seen == [(mx.Device(mx.cpu, 0), cn.Device.cpu().stream)]
        assert mx.default_device() == mx.Device(mx.gpu, 0)  # restored after the call
        gpu_model = Probe.load(cn.VarBuilder.from_tensors(probe_weights(), device="gpu"))
        mx.set_default_device(mx.cpu)
        gpu_model(mx.array(np.ones((2, 4), np.float32)))
        assert gpu_model.seen == [(mx.Device(mx.gpu, 0), cn.Device.gpu().stream)]
    finally:
        mx.set_default_device(previous)


def test_cpu_module_uses_its_stream_not_the_current_one():
    """Whatever stream is current at call time (here a fresh CPU stream), the forward runs on the
    module's device stream and the caller's stream is restored afterwards."""
    other = mx.new_stream(mx.cpu)
    model = Probe.load(cn.VarBuilder.from_tensors(probe_weights(), device="cpu"))
    with mx.stream(other):
        model(mx.array(np.ones((1, 4), np.float32)))
        assert mx.default_stream(mx.default_device()) == other
    assert model.seen == [(mx.Device(mx.cpu, 0), cn.Device.cpu().stream)]
    assert model.seen[0][1] != other


def test_stateless_modules_run_on_the_caller_stream():
    pool = cn.MaxPool2d(2)
    assert pool.device is None
    seen = []

    class Spy(cn.Activation):
        def forward(self, x):
            seen.append(mx.default_stream(mx.default_device()))
            return super().forward(x)

    other = mx.new_stream(mx.cpu)
    with mx.stream(other):
        Spy("relu")(mx.zeros((1, 2)))
    assert seen == [other]


# -- mixing devices ------------------------------------------------------------------------------
def linear_on(device: cn.Device, seed: int = 0) -> cn.Linear:
    r = np.random.default_rng(seed)
    t = {"weight": r.standard_normal((4, 4)).astype(np.float32),
         "bias": r.standard_normal(4).astype(np.float32)}
    return cn.Linear.load(cn.VarBuilder.from_tensors(t, device=device), 4, 4)


def assert_mismatch_message(info, op: str) -> None:
    msg = str(info.value)
    assert op in msg, msg
    assert "cpu" in msg and "gpu:0" in msg, msg
    assert ".to(" in msg and "VarBuilder" in msg, msg


def test_two_devices_fixture_cleans_up(two_devices):
    cpu, gpu = two_devices
    assert gpu.kind == "gpu" and gpu != cpu and hash(gpu) != hash(cpu)


def test_fake_gpu_is_removed_after_use():
    if not HAS_GPU:
        assert ("gpu", 0) not in cn.Device._interned
        with pytest.raises(cn.DeviceUnavailableError):
            cn.Device.gpu()


def test_sequential_of_two_devices_raises(two_devices):
    cpu, gpu = two_devices
    a, b = linear_on(cpu), linear_on(gpu, 1)
    assert a.device is cpu and b.device is gpu
    with pytest.raises(cn.DeviceMismatchError) as info:
        cn.Sequential(a, cn.relu, b)
    assert_mismatch_message(info, "Sequential")
    assert "layer 0" in str(info.value) and "layer 2" in str(info.value)
    with pytest.raises(cn.DeviceMismatchError) as info:
        cn.seq([a, b])
    assert_mismatch_message(info, "Sequential")
    model = cn.Sequential(cn.relu, a)
    with pytest.raises(cn.DeviceMismatchError) as info:
        model.append(b)
    assert_mismatch_message(info, "Sequential.append")
    assert len(model) == 2


def test_attribute_assignment_across_devices_raises(two_devices):
    cpu, gpu = two_devices

    class Model(cn.Module):
        def __init__(self, fc: cn.Linear) -> None:
            super().__init__(fc.device)
            self.fc = fc

        def forward(self, x):
            return self.fc(x)

    t = {"weight": np.eye(4, dtype=np.float32), "bias": np.zeros(4, np.float32)}
    model = Model(cn.Linear.load(cn.VarBuilder.from_tensors(t, device=cpu), 4, 4))
    with pytest.raises(cn.DeviceMismatchError) as info:
        model.head = linear_on(gpu)
    assert_mismatch_message(info, "Model.head")
    assert "head" not in model
    with pytest.raises(cn.DeviceMismatchError) as info:
        model.blocks = [linear_on(cpu), linear_on(gpu)]
    assert_mismatch_message(info, "list of modules")
    with pytest.raises(cn.DeviceMismatchError):
        model.blocks = {"a": linear_on(gpu)}
    # mixing VarBuilders of two devices inside one model's constructor is caught the same way
    with pytest.raises(cn.DeviceMismatchError) as info:
        class Mixed(cn.Module):
            def __init__(self) -> None:
                super().__init__(cpu)
                self.fc = cn.Linear.load(cn.VarBuilder.from_tensors(t, device=gpu), 4, 4)
        Mixed()
    assert_mismatch_message(info, "Mixed.fc")
    model.head = linear_on(cpu)  # same device: fine
    model.pool = cn.MaxPool2d(2)  # stateless: fine


def test_check_same_device_directly(two_devices):
    cpu, gpu = two_devices
    cn.check_same_device("op", cpu, cpu)
    cn.check_same_device("op", cpu, None)
    with pytest.raises(cn.DeviceMismatchError) as info:
        cn.check_same_device("my_op", cpu, gpu, "lhs", "rhs")
    assert "my_op: lhs is on cpu but rhs is on gpu:0" in str(info.value)
    assert "Device.parse('cpu')" in str(info.value)


def test_stateless_container_may_not_straddle_two_devices(two_devices):
    """A Module built with device=None used to accept children of two devices silently."""
    cpu, gpu = two_devices
    eye = {"weight": np.eye(2, dtype=np.float32)}
    on_cpu = cn.Linear.load(cn.VarBuilder.from_tensors(eye, device=cpu), 2, 2, bias=False)
    on_gpu = cn.Linear.load(cn.VarBuilder.from_tensors(eye, device=gpu), 2, 2, bias=False)

    class Container(cn.Module):
        def forward(self, x):
            return self.head(self.body(x))

    box = Container()
    box.body = on_cpu
    box.pool = cn.MaxPool2d(2)  # stateless children are fine
    box.body = on_cpu  # re-assigning the same slot is fine
    with pytest.raises(cn.DeviceMismatchError) as info:
        box.head = on_gpu
    msg = str(info.value)
    assert "Container.head" in msg and "child 'body' is on cpu" in msg and "gpu:0" in msg
    assert "head" not in box
    box.body = on_gpu  # replacing the only device-bound child moves the container: fine
    box.head = on_gpu
    with pytest.raises(cn.DeviceMismatchError, match="child 'blocks' is on gpu:0"):
        other = Container()
        other.blocks = [on_gpu]
        other.head = on_cpu


# -- module.to -----------------------------------------------------------------------------------
def build_net(device: cn.Device) -> cn.Sequential:
    return cn.Sequential(linear_on(device, 0), cn.relu, linear_on(device, 1), cn.Activation("silu"))


def test_module_to_moves_every_child(two_devices):
    cpu, gpu = two_devices
    net = build_net(cpu)
    assert net.to(gpu) is net  # in place (no op runs on the target for this move)
    assert net.device is gpu
    assert net[0].device is gpu and net[2].device is gpu and net[3].device is None
    with pytest.raises(cn.DeviceMismatchError):
        net.append(linear_on(cpu))
    net.to("cpu")
    assert net.device is cpu and net[0].device is cpu and net[2].device is cpu
    net.append(linear_on(cpu, 2))


def test_module_to_keeps_results(device):
    x = mx.array(np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32))
    net = build_net(cn.Device.cpu())
    ref = np.array(net(x))
    net.to(device)
    assert all(m.device == device for m in (net, net[0], net[2]))
    np.testing.assert_allclose(np.array(net(x)), ref, rtol=1e-6, atol=1e-6)
    net.to(str(cn.Device.cpu()))
    np.testing.assert_allclose(np.array(net(x)), ref, rtol=1e-6, atol=1e-6)


def test_module_to_unavailable_device_raises():
    net = build_net(cn.Device.cpu())
    with pytest.raises(cn.DeviceUnavailableError):
        net.to(f"gpu:{cn_device._gpu_count()}")
    assert net.device is cn.Device.cpu()
