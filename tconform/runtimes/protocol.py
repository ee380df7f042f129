"""The worker protocol: the messages between tconform and a runtime's worker process
(tconform.runtimes.remote), over a pair of pipes.

A message is a JSON header followed by the raw bytes of its tensors:

    8 bytes     the header's length, little-endian unsigned
    header      a UTF-8 JSON object; its "tensors" lists each tensor's name, dtype, shape and
                byte count, in the order their bytes follow
    tensors     each tensor's bytes, C order, this machine's byte order

Nothing is pickled: a worker runs in another interpreter (another Python, other package
versions), and a pickle from it could run code here. Both ends live on one machine, so native
byte order is the order. The worker imports this module too, so it needs numpy only (and
ml_dtypes for bfloat16, which onnx brings).
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from collections.abc import Mapping

import numpy as np

_LENGTH = struct.Struct("<Q")
MAX_HEADER_BYTES = 64 * 2**20  # far beyond any header; a larger length is a broken stream
CHUNK = 1 << 20  # bytes per read or write, so a deadline is looked at between chunks


class ChannelClosed(Exception):
    """The other end has gone: its process ended (or closed the pipe) mid-conversation."""


class ChannelTimeout(Exception):
    """No answer before the deadline: the other end may be hung."""


def dtype_name(dtype: np.dtype) -> str:
    """A tensor's element type as the header names it: NumPy's name ('float32', 'bool',
    'int64'; 'bfloat16' and the other ml_dtypes types by theirs), with the width of a string."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OV" and dtype.names is None and dtype.type.__module__.startswith("ml_dtypes"):
        return dtype.name
    if dtype.kind in "SU":
        return dtype.str.lstrip("<>|=")  # 'U5', 'S3'
    if dtype.kind in "OV" or dtype.names is not None:
        raise ValueError(f"a tensor of {dtype} cannot cross to a worker (numbers, bool, strings)")
    return dtype.name


def dtype_of(name: str) -> np.dtype:
    """The NumPy type a header names (the inverse of `dtype_name`)."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        found = getattr(ml_dtypes, name, None)
        if found is None:
            raise ValueError(f"unknown tensor type {name!r}") from None
        return np.dtype(found)


def _bytes_of(array: np.ndarray) -> memoryview:
    """The array's bytes in C order and native byte order, without a copy where it already is."""
    array = np.ascontiguousarray(array)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return memoryview(array.reshape(-1).view(np.uint8))


class Channel:
    """One end of a conversation: reads messages from one file descriptor, writes them to
    another. A `deadline` (time.monotonic()) bounds a send or receive: past it, ChannelTimeout."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd

    def send(
        self,
        header: Mapping[str, object],
        tensors: Mapping[str, np.ndarray] | None = None,
        deadline: float | None = None,
    ) -> None:
        arrays = {name: np.asarray(value) for name, value in (tensors or {}).items()}
        described = [
            {
                "name": name,
                "dtype": dtype_name(a.dtype),
                "shape": list(a.shape),
                "nbytes": int(a.nbytes),
            }
            for name, a in arrays.items()
        ]
        text = json.dumps({**header, "tensors": described}).encode()
        self._write(memoryview(_LENGTH.pack(len(text)) + text), deadline)
        for array in arrays.values():
            if array.nbytes:
                self._write(_bytes_of(array), deadline)

    def receive(self, deadline: float | None = None) -> tuple[dict, dict[str, np.ndarray]]:
        """The next message: its header (without "tensors") and its tensors by name."""
        (length,) = _LENGTH.unpack(self._read(_LENGTH.size, deadline))
        if length > MAX_HEADER_BYTES:
            raise ChannelClosed(f"a header of {length} bytes: the stream is broken")
        header = json.loads(bytes(self._read(length, deadline)))
        tensors = {}
        for described in header.pop("tensors", []):
            dtype = dtype_of(described["dtype"])
            shape = tuple(int(n) for n in described["shape"])
            data = self._read(int(described["nbytes"]), deadline)
            tensors[described["name"]] = np.frombuffer(data, dtype=dtype).reshape(shape)
        return header, tensors

    def _wait(self, fd: int, writing: bool, deadline: float | None) -> None:
        if deadline is None:
            return
        remaining = max(deadline - time.monotonic(), 0.0)
        watched = ([], [fd]) if writing else ([fd], [])
        readable, writable, _ = select.select(*watched, [], remaining)
        if not readable and not writable:
            raise ChannelTimeout()

    def _write(self, data: memoryview, deadline: float | None) -> None:
        written = 0
        while written < len(data):
            self._wait(self.write_fd, True, deadline)
            try:
                written += os.write(self.write_fd, data[written : written + CHUNK])
            except (BrokenPipeError, ConnectionResetError):
                raise ChannelClosed("the other end closed its pipe") from None

    def _read(self, size: int, deadline: float | None) -> bytearray:
        buffer = bytearray(size)
        view = memoryview(buffer)
        got = 0
        while got < size:
            self._wait(self.read_fd, False, deadline)
            count = os.readv(self.read_fd, [view[got : got + CHUNK]])
            if count == 0:
                raise ChannelClosed("the other end closed its pipe")
            got += count
        return buffer
