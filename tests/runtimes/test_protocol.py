"""The worker protocol carries every tensor a session takes or gives back, bit for bit, with its
dtype and shape, and no pickle; runtime specs parse as documented."""

from __future__ import annotations

import os
import threading

import ml_dtypes
import numpy as np
import pytest

from tconform.runtimes.protocol import Channel, ChannelClosed, ChannelTimeout, dtype_name
from tconform.runtimes.specs import RuntimeSpec, base_name, parse_spec

pytestmark = pytest.mark.unit


def _round_trip(header: dict, tensors: dict[str, np.ndarray]):
    """Send through a real pipe (a thread reads, so a tensor larger than the pipe's buffer
    cannot block the writer) and return what arrived."""
    read_fd, write_fd = os.pipe()
    received = {}

    def reader() -> None:
        received["message"] = Channel(read_fd, -1).receive()

    thread = threading.Thread(target=reader)
    thread.start()
    Channel(-1, write_fd).send(header, tensors)
    thread.join(30)
    os.close(read_fd)
    os.close(write_fd)
    return received["message"]


TENSORS = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "f16": np.array([[1.5, -0.0, np.inf]], dtype=np.float16),
    "bf16": np.array([1.0, 3.140625, -2e-38], dtype=ml_dtypes.bfloat16),
    "f64": np.array(np.pi),  # 0-d
    "i64": np.array([[-(2**62)], [7]], dtype=np.int64),
    "i8": np.array([-128, 127], dtype=np.int8),
    "u8": np.array([0, 255], dtype=np.uint8),
    "bool": np.array([[True, False, True]]),
    "empty": np.zeros((2, 0, 3), dtype=np.float32),
    "scalar_bool": np.array(False),
    "text": np.array(["a", "bcd"]),
    "wide": np.random.default_rng(0).standard_normal((600, 700)).astype(np.float32),  # > pipe
}


def test_every_dtype_and_shape_crosses_bit_for_bit():
    header, tensors = _round_trip({"op": "run", "outputs": None}, TENSORS)
    assert header == {"op": "run", "outputs": None}
    assert list(tensors) == list(TENSORS)
    for name, sent in TENSORS.items():
        got = tensors[name]
        assert got.dtype == sent.dtype and got.shape == sent.shape, name
        assert got.tobytes() == sent.tobytes(), name


def test_views_and_other_byte_orders_arrive_as_their_values():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    sent = {"strided": base[:, ::2], "transposed": base.T, "big": base.astype(">f4")}
    _, tensors = _round_trip({}, sent)
    for name, value in sent.items():
        np.testing.assert_array_equal(tensors[name], value)
    assert tensors["big"].dtype == np.float32  # native order on arrival


def test_an_object_array_is_refused_before_anything_is_written():
    with pytest.raises(ValueError, match="cannot cross to a worker"):
        dtype_name(np.array([{}], dtype=object).dtype)
    read_fd, write_fd = os.pipe()
    try:
        with pytest.raises(ValueError):
            Channel(-1, write_fd).send({}, {"x": np.array([None], dtype=object)})
        os.close(write_fd)
        with pytest.raises(ChannelClosed):  # nothing was written: the reader sees the end
            Channel(read_fd, -1).receive()
    finally:
        os.close(read_fd)


def test_a_silent_peer_is_a_timeout_and_a_gone_one_a_close():
    import time

    read_fd, write_fd = os.pipe()
    with pytest.raises(ChannelTimeout):
        Channel(read_fd, -1).receive(deadline=time.monotonic() + 0.05)
    os.close(write_fd)
    with pytest.raises(ChannelClosed):
        Channel(read_fd, -1).receive()
    os.close(read_fd)


@pytest.mark.parametrize(
    "text, spec",
    [
        ("onnxruntime", RuntimeSpec("onnxruntime")),
        ("onnxruntime==1.20.1", RuntimeSpec("onnxruntime", "1.20.1")),
        ("openvino==2025.4.0", RuntimeSpec("openvino", "2025.4.0")),
        ("onnxruntime@/opt/py/python", RuntimeSpec("onnxruntime", None, "/opt/py/python")),
        ("openvino==2024.6.0@python3.10", RuntimeSpec("openvino", "2024.6.0", "python3.10")),
    ],
)
def test_specs_parse_and_print_as_written(text, spec):
    assert parse_spec(text) == spec
    assert spec.text == text and base_name(text) == spec.name
    assert spec.in_worker == (text != "onnxruntime")


@pytest.mark.parametrize(
    "text", ["onnxruntime==", "onnxruntime==1.2; rm -rf", "onnxruntime>=1.20", "==1.2", "ort@"]
)
def test_a_malformed_spec_says_what_is_wrong(text):
    with pytest.raises(ValueError, match=r"release number|NAME==VERSION|interpreter"):
        parse_spec(text)
