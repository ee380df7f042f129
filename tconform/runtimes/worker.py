"""The worker: one runtime of tconform.runtimes.RUNTIMES in a process of its own, answering the
requests of its proxy in tconform (tconform.runtimes.remote) over the protocol of
tconform.runtimes.protocol.

It runs in another interpreter (another release of the runtime, another Python) that holds the
runtime's package, numpy and onnx, and of tconform only the modules the proxy sent
(tconform.runtimes.boot): the runtime classes are tconform's own, so a session opened here says
what it says in tconform's process (providers, placement, precision, notes). Tensors a session
keeps (run_bound's cache, to_device's copies) stay here, named by handles. Bench's timing loop
runs here too, so no pipe lies inside it.

Requests, by their "op" (replies echo nothing but what is asked; an exception is a reply with
"error", its type, message and kind, never the end of the worker):

    start    {runtime, ep, options}      -> runtime (its number), precision, settings,
                                            device_memory, python, pid
    open     {runtime, path}             -> session, providers, placement, fallback_ops,
                                            precision, inputs, outputs, notes, device
    run      {session, outputs} + feeds  -> the outputs, by name, in order
    run_bound {session, keep, handles} + feeds -> kept {name: handle}, the others as tensors
    to_device {session} + array          -> handle
    take     {session, handle, axis} + rows -> handle
    release  {handles}
    prepare  {session, io_binding} + feeds -> call, details (a TimedCall, for bench)
    times    {call, warmup, runs, seconds} -> times (seconds per timed run)
    call     {call}                       -> one run of the prepared call
    memory   {call}                       -> device_memory_mb, peak_mem_mb, peak_mem_delta_mb
    finish   {call}                       -> the prepared call closed
    profile  {session} + feeds            -> op_profile (None where the runtime has none)
    close    {session}
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import numpy as np

from tconform.errors import (
    KernelMissing,
    ProviderUnavailable,
    RuntimeRejected,
    RuntimeTooOld,
    TconformError,
    UsageError,
)
from tconform.runtimes import make_runtime
from tconform.runtimes.protocol import Channel, ChannelClosed, dtype_name
from tconform.runtimes.timing import peak_rss_mb, reset_peak_rss, rss_mb, timed_runs


def _kind(exc: BaseException) -> str:
    """How the proxy raises it again: as the tconform error it was, or as the runtime's own."""
    if isinstance(exc, KernelMissing):
        return "kernel"
    if isinstance(exc, RuntimeTooOld):
        return "too_old"
    if isinstance(exc, RuntimeRejected):
        return "rejected"
    if isinstance(exc, ProviderUnavailable):
        return "unavailable"
    if isinstance(exc, UsageError):
        return "usage"
    if isinstance(exc, TconformError):
        return "tconform"
    return "runtime"


def _error(exc: BaseException) -> dict[str, object]:
    error: dict[str, object] = {"type": type(exc).__name__, "message": str(exc), "kind": _kind(exc)}
    if isinstance(exc, KernelMissing):
        error["kernel"] = [exc.runtime, exc.op_type, exc.dtype]
    if isinstance(exc, TconformError):
        error["exit_code"] = exc.exit_code
    return error


def _shape(value: object) -> list[int]:
    """A kept tensor's shape (an OrtValue says it with shape(), an array with .shape)."""
    shape = value.shape() if callable(getattr(value, "shape", None)) else np.shape(value)
    return [int(n) for n in shape]


class Worker:
    """The runtimes, their sessions, the tensors these keep and the calls prepared for timing,
    each by its number."""

    def __init__(self) -> None:
        self.runtimes: dict[int, object] = {}
        self.sessions: dict[int, object] = {}
        self.kept: dict[int, object] = {}
        self.calls: dict[int, object] = {}
        self.rss_at_prepare: dict[int, float | None] = {}
        self.ids = itertools.count(1)

    def handle(self, op: str, request: dict, tensors: dict[str, np.ndarray]):
        """(reply, tensors) for one request."""
        if op == "start":
            if request["ep"] != "cpu":  # a GPU: only ONNX Runtime runs one in a worker
                # here, not at the top: a worker for OpenVINO has no onnxruntime to import
                from tconform.runtimes.providers import load_device_libraries

                load_device_libraries()  # no torch here to have loaded them
            runtime = make_runtime(request["runtime"], request["ep"], **request["options"])
            number = next(self.ids)
            self.runtimes[number] = runtime
            return {
                "runtime": number,
                "precision": runtime.precision,
                "settings": runtime.settings(),
                "device_memory": runtime.device_memory,
                "python": sys.version.split()[0],
                "pid": os.getpid(),
            }, {}
        if op == "open":
            session = self.runtimes[request["runtime"]].open(Path(request["path"]))
            number = next(self.ids)
            self.sessions[number] = session
            return {
                "session": number,
                "providers": list(session.providers),
                "placement": dict(session.placement),
                "fallback_ops": dict(session.fallback_ops),
                "precision": session.precision,
                "inputs": [
                    [
                        i.name,
                        dtype_name(i.dtype) if i.dtype is not None else None,
                        i.rank,
                        list(i.fixed) if i.fixed is not None else None,
                    ]
                    for i in session.inputs
                ],
                "outputs": list(session.outputs),
                "notes": list(session.notes),
                "device": list(session.device),
            }, {}
        if op == "release":
            for number in request["handles"]:
                self.kept.pop(number, None)
            return {}, {}
        if op in ("times", "call", "memory", "finish"):
            return self._timed(op, request)
        session = self.sessions[request["session"]]
        if op == "run":
            return {}, session.run(tensors, request.get("outputs"))
        if op == "run_bound":
            feeds = {**tensors, **{n: self.kept[h] for n, h in request["handles"].items()}}
            values = session.run_bound(feeds, set(request["keep"]))
            kept = {n: self._keep(v) for n, v in values.items() if n in request["keep"]}
            return {"kept": kept}, {n: v for n, v in values.items() if n not in kept}
        if op == "to_device":
            return {"kept": self._keep(session.to_device(tensors["array"]))}, {}
        if op == "take":
            value = session.take(self.kept[request["handle"]], tensors["rows"], request["axis"])
            return {"kept": self._keep(value)}, {}
        if op == "prepare":
            reset_peak_rss()  # this session's peak, as bench measures each engine's
            number = next(self.ids)
            self.rss_at_prepare[number] = rss_mb()
            self.calls[number] = session.timed_call(tensors, request["io_binding"])
            return {"call": number, "details": self.calls[number].details}, {}
        if op == "profile":
            return {"op_profile": session.op_profile(tensors)}, {}
        if op == "close":
            self.sessions.pop(request["session"]).close()
            return {}, {}
        raise ValueError(f"unknown request {op!r}")

    def _keep(self, value: object) -> list[object]:
        """[handle, shape, dtype] of a tensor that stays here."""
        number = next(self.ids)
        self.kept[number] = value
        dtype = value.dtype if isinstance(value, np.ndarray) else None
        return [number, _shape(value), dtype_name(dtype) if dtype is not None else None]

    def _timed(self, op: str, request: dict):
        call = self.calls[request["call"]]
        if op == "times":
            times = timed_runs(call.run, request["warmup"], request["runs"], request["seconds"])
            return {"times": times}, {}
        if op == "call":
            call.run()
            return {}, {}
        if op == "memory":
            before = self.rss_at_prepare.get(request["call"])
            peak = peak_rss_mb()
            return {
                "device_memory_mb": call.device_memory_mb(),
                "peak_mem_mb": round(peak, 1),
                "peak_mem_delta_mb": round(peak - before, 1) if before is not None else None,
                "peak_mem_method": "the worker process's VmHWM, reset when the call was prepared",
            }, {}
        self.calls.pop(request["call"]).close()
        return {}, {}


def serve(read_fd: int, write_fd: int) -> None:
    """Answer requests until the proxy closes its end (or says "quit")."""
    channel = Channel(read_fd, write_fd)
    worker = Worker()
    while True:
        try:
            request, tensors = channel.receive()
        except ChannelClosed:
            return
        op = request.get("op")
        if op == "quit":
            return
        try:
            reply, out = worker.handle(op, request, tensors)
        except Exception as exc:
            reply, out = {"error": _error(exc)}, {}
        try:
            channel.send(reply, out)
        except ValueError as exc:  # an output that cannot cross (an object array)
            channel.send({"error": _error(exc)})
        except ChannelClosed:
            return
