"""Models work from any thread: one stream per (thread, device), weights evaluated when built."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import numpy as np
import pytest

import candle_nn as cn
from candle_nn_models.resnet import ResNet
from test_core_device import assert_mismatch_message, linear_on

THREADS, CALLS = 4, 20


def _resnet18(folder, device: cn.Device) -> ResNet:
    vb = cn.VarBuilder.from_safetensors(folder / "weights.safetensors", device=device)
    return ResNet.load(vb, "resnet18", 1000)


@pytest.fixture(scope="module")
def inputs():
    xs = [mx.random.uniform(shape=(1, 64, 64, 3), key=mx.random.key(i)) for i in range(THREADS)]
    mx.eval(xs)  # MLX: a pending computation only runs in the thread that made it
    return xs


def test_one_model_called_from_four_threads_matches_single_threaded_bit_for_bit(
        resnet18_fixture, device, inputs):
    model = _resnet18(resnet18_fixture[2], device)
    expected = [np.array(model(x)) for x in inputs]

    def calls(worker: int) -> list[np.ndarray]:
        return [np.array(model(inputs[(worker + i) % THREADS])) for i in range(CALLS)]

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(calls, range(THREADS)))
    assert sum(len(r) for r in results) == THREADS * CALLS
    for worker, outputs in enumerate(results):
        for i, got in enumerate(outputs):
            np.testing.assert_array_equal(got, expected[(worker + i) % THREADS],
                                          err_msg=f"thread {worker}, call {i}")


def test_model_built_inside_a_worker_thread_works_there_and_elsewhere(
        resnet18_fixture, device, inputs):
    expected = np.array(_resnet18(resnet18_fixture[2], device)(inputs[0]))

    def build_and_call() -> tuple[ResNet, np.ndarray]:
        model = _resnet18(resnet18_fixture[2], device)
        return model, np.array(model(inputs[0]))

    with ThreadPoolExecutor(1) as pool:
        model, in_worker = pool.submit(build_and_call).result()
    np.testing.assert_array_equal(in_worker, expected)
    np.testing.assert_array_equal(np.array(model(inputs[0])), expected)  # back in the main thread


def test_each_thread_has_its_own_stream_of_the_one_device(device):
    seen = {}

    def record(name: str) -> None:
        assert device.stream is device.stream  # made once per thread
        seen[name] = device.stream

    record("main")
    workers = [threading.Thread(target=record, args=(f"w{i}",)) for i in range(2)]
    for w in workers:
        w.start()
        w.join()
    assert seen["main"] == mx.default_stream(device.mx_device)
    assert len({str(s) for s in seen.values()}) == 3
    assert all(s.device == device.mx_device for s in seen.values())


def test_mixing_devices_is_still_an_error_in_a_worker_thread(two_devices):
    cpu, gpu = two_devices

    def build() -> cn.Sequential:
        return cn.Sequential(linear_on(cpu), cn.relu, linear_on(gpu, 1))

    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(cn.DeviceMismatchError) as info:
            pool.submit(build).result()
    assert_mismatch_message(info, "Sequential")
