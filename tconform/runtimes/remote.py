"""Runtimes in a worker process: any release of a runtime, in any interpreter, and a crash that is
a verdict rather than the end of the run (as Polygraphy's runners can run in a subprocess).

    runtime = make_runtime("onnxruntime==1.20.1", "cpu")   # a RemoteRuntime
    session = runtime.open(path)                          # a RemoteSession

A `RemoteRuntime` is a runtime of tconform.runtimes.RUNTIMES named by a spec with a release or an
interpreter (tconform.runtimes.specs). Its environment is made on first use
(tconform.runtimes.environments); its worker is a process of that interpreter, started with
tconform's worker code (tconform.runtimes.boot, .worker, and the runtime modules they import),
one per interpreter, shared by the runtimes that run in it, speaking the protocol of
tconform.runtimes.protocol over two pipes. The execution layer treats its sessions as any other:
they say what the worker's session says (providers, placement, precision, notes), tensors they
keep stay in the worker by handle (run_bound, to_device, take: a decoding cache never crosses the
pipe), and bench's timing loop runs in the worker (TimedCall.times).

A worker that dies (a segmentation fault, abort, the out-of-memory killer, kill), or does not
answer within TCONFORM_WORKER_TIMEOUT seconds (it is then killed), raises WorkerCrashed naming
how it ended and what it was doing; the execution layer makes that the result's verdict
(Status.CRASH) and the next request starts a new worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shlex
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from tconform.errors import (
    KernelMissing,
    ProviderUnavailable,
    RuntimeRejected,
    RuntimeTooOld,
    TconformError,
    UsageError,
    WorkerCrashed,
    first_line,
    how_it_ended,
)
from tconform.runtimes.base import Runtime, Session, TensorInfo, TimedCall
from tconform.runtimes.crashes import write_crash_bundle
from tconform.runtimes.environments import (
    Environment,
    given_environment,
    made_environment,
    python_running,
)
from tconform.runtimes.protocol import Channel, ChannelClosed, ChannelTimeout, dtype_of
from tconform.runtimes.specs import RuntimeSpec
from tconform.variables import value

STOP_GRACE_S = 5.0
# A timed loop of N runs may take this many times N first runs (plus the worker's timeout)
# before it counts as hung: no machine's noise slows a run a hundredfold, and a loop of 300
# runs of a hung model is found in seconds, not in 300 timeouts.
LOOP_SLACK = 100.0
# The modules a worker imports, sent to it as sources (tconform itself is not installed there).
WORKER_MODULES = (
    "tconform",
    "tconform.errors",
    "tconform.compare",
    "tconform.noops",
    "tconform.provenance",
)
WORKER_PACKAGE = "tconform.runtimes"  # all of it


@functools.cache
def worker_sources() -> dict[str, tuple[str, bool]]:
    """{module: (source, is a package)} of every module a worker imports."""
    root = Path(__file__).resolve().parent.parent  # the tconform package
    sources = {}
    for name in WORKER_MODULES:
        parts = name.split(".")[1:]
        path = root.joinpath(*parts, "__init__.py") if not parts else root.joinpath(*parts)
        path = path if path.name == "__init__.py" else path.with_suffix(".py")
        sources[name] = (path.read_text(encoding="utf-8"), path.name == "__init__.py")
    package = root / "runtimes"
    for path in sorted(package.glob("*.py")):
        name = WORKER_PACKAGE if path.stem == "__init__" else f"{WORKER_PACKAGE}.{path.stem}"
        sources[name] = (path.read_text(encoding="utf-8"), path.stem == "__init__")
    return sources


class WorkerProcess:
    """One worker: an interpreter running tconform.runtimes.worker, its two pipes, and the file
    its stdout and stderr go to (read back only to quote a crash's last words)."""

    def __init__(self, python: Path, what: str) -> None:
        self.python = python
        self.what = what  # for messages: the spec it was started for
        self.timeout = float(value("TCONFORM_WORKER_TIMEOUT"))  # per request
        self.ended: str | None = None  # how it ended, once it has
        self.lock = threading.Lock()  # one request at a time
        self.released: list[int] = []  # handles the proxy dropped, freed with the next request
        self._start()

    def _start(self) -> None:
        from tconform.runtimes import boot

        to_worker, from_parent = os.pipe()
        to_parent, from_worker = os.pipe()
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed when the worker ends)
        command = python_running(self.python, Path(boot.__file__).read_text(encoding="utf-8"))
        try:
            self.process = subprocess.Popen(
                [*command, str(to_worker), str(from_worker)],
                pass_fds=(to_worker, from_worker),
                stdin=subprocess.DEVNULL,
                stdout=self.log,
                stderr=self.log,
                start_new_session=True,  # a Ctrl-C at the terminal is tconform's to act on
            )
        except OSError as exc:
            for fd in (to_worker, from_parent, to_parent, from_worker):
                os.close(fd)
            raise UsageError(f"{self.python}: cannot start a worker: {exc}") from None
        os.close(to_worker)
        os.close(from_worker)
        self.channel = Channel(to_parent, from_parent)
        sources = json.dumps(worker_sources()).encode()
        try:
            self.channel._write(memoryview(struct.pack("<Q", len(sources)) + sources), None)
        except ChannelClosed:
            self._fail("starting")

    @property
    def alive(self) -> bool:
        return self.ended is None

    def request(
        self,
        op: str,
        header: Mapping[str, object] | None = None,
        tensors: Mapping[str, np.ndarray] | None = None,
        doing: str = "",
        seconds: float | None = None,
    ) -> tuple[dict, dict[str, np.ndarray]]:
        """The worker's reply to one request; WorkerCrashed where it dies or does not answer
        within its timeout (plus `seconds`, the request's own time budget)."""
        if self.ended is not None:
            raise WorkerCrashed(f"{self.what}: its worker had ended earlier: {self.ended}")
        with self.lock:
            request = {"op": op, **(header or {})}
            released, self.released = self.released, []
            deadline = time.monotonic() + self.timeout + (seconds or 0.0)
            try:
                if released:
                    self.channel.send({"op": "release", "handles": released}, None, deadline)
                    self.channel.receive(deadline)
                self.channel.send(request, tensors, deadline)
                reply, out = self.channel.receive(deadline)
            except ChannelClosed:
                self._fail(doing or op)
            except ChannelTimeout:
                self._kill()
                self._fail(doing or op, hung=self.timeout + (seconds or 0.0))
            except BaseException:  # interrupted mid-message: the stream cannot be trusted
                self._kill()
                self.ended = "stopped while tconform was interrupted"
                raise
        if "error" in reply:
            raise _raised(reply["error"])
        return reply, out

    def _fail(self, doing: str, hung: float | None = None) -> None:
        """The worker has gone: say how, with its last line on stderr, and never use it again."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_GRACE_S)
        if hung is not None:
            how = f"did not answer within {hung:g} s (hung) and was killed (SIGKILL)"
        elif self.process.poll() is None:  # closed its pipe, yet runs on
            self._kill()
            how = "closed its pipe mid-request and was killed (SIGKILL)"
        else:
            how = how_it_ended(self.process.poll())
        last = self._last_words()
        self.ended = how
        self._close()
        raise WorkerCrashed(
            f"{self.what}: the worker process {how} while {doing}"
            + (f"; its last words: {last}" if last else "")
        )

    def _last_words(self) -> str:
        try:
            self.log.seek(0, os.SEEK_END)
            size = self.log.tell()
            self.log.seek(max(0, size - 4096))
            text = self.log.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_GRACE_S)

    def _close(self) -> None:
        for fd in (self.channel.read_fd, self.channel.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            self.log.close()

    def stop(self) -> None:
        """Ask it to end (closing its input ends it), then kill it if it does not."""
        if self.ended is not None:
            return
        self.ended = "stopped by tconform"
        with contextlib.suppress(OSError):
            os.close(self.channel.write_fd)
        try:
            self.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self._kill()
        with contextlib.suppress(OSError):
            os.close(self.channel.read_fd)
        with contextlib.suppress(OSError):
            self.log.close()


def _raised(error: dict) -> BaseException:
    """A worker's exception, raised here as what it was: tconform's own errors as themselves,
    a runtime's under its own type name, so its one line reads as in tconform's process."""
    message = str(error["message"])
    kind = error["kind"]
    if kind == "kernel":
        return KernelMissing(*error["kernel"])
    if kind == "too_old":
        return RuntimeTooOld(message)
    if kind == "rejected":
        return RuntimeRejected(message)
    if kind == "unavailable":
        return ProviderUnavailable(message)
    if kind == "usage":
        return UsageError(message)
    if kind == "tconform":
        return TconformError.with_code(message, int(error.get("exit_code", 2)))
    return _runtime_error(str(error["type"]))(message)


@functools.cache
def _runtime_error(name: str) -> type[Exception]:
    """An exception type named as the worker's was (ONNX Runtime's Fail, InvalidArgument...)."""
    return type(name, (RuntimeError,), {"__module__": __name__})


# One worker per interpreter, shared by the runtimes that run in it; a new one after a crash.
_WORKERS: dict[Path, WorkerProcess] = {}
_WORKERS_LOCK = threading.Lock()


def worker_for(environment: Environment, what: str) -> WorkerProcess:
    with _WORKERS_LOCK:
        worker = _WORKERS.get(environment.python)
        if worker is None or not worker.alive:
            worker = WorkerProcess(environment.python, what)
            _WORKERS[environment.python] = worker
            weakref.finalize(worker, WorkerProcess.stop, worker)  # also at exit
        return worker


def stop_workers() -> None:
    """End every worker (the end of a run; also done at exit)."""
    with _WORKERS_LOCK:
        for worker in _WORKERS.values():
            worker.stop()
        _WORKERS.clear()


@dataclass
class RemoteRuntime(Runtime):
    """A runtime of RUNTIMES run in a worker: `spec` names it with a release or an interpreter;
    `options` are the fields of its class it is given (threads, graph_opt, bf16, ...)."""

    consumes: ClassVar[str] = "onnx"

    spec: RuntimeSpec
    ep: str = "cpu"
    options: dict[str, object] = field(default_factory=dict)
    crash_folder: Path | None = None  # where a crash's repro bundle goes (the command's choice)
    package: str = ""  # the runtime's distribution on the package index
    _started: tuple[WorkerProcess, int, dict] | None = field(default=None, repr=False)
    _start_crash: str = field(default="", repr=False)

    @property
    def name(self) -> str:
        return self.spec.text

    @property
    def eps(self) -> tuple[str, ...]:
        from tconform.runtimes import runtime_class

        return runtime_class(self.spec.name).eps

    @functools.cached_property
    def environment(self) -> Environment:
        """The interpreter it runs in: given (NAME@PYTHON) or made (NAME==VERSION)."""
        module = self.package.replace("-", "_")
        if self.spec.version:
            return made_environment(self.spec, self.package, module)
        return given_environment(self.spec, self.package, module)

    def _worker(self) -> tuple[WorkerProcess, int, dict]:
        """The worker holding this runtime (started, and the runtime made there, as needed)."""
        if self._started is not None and self._started[0].alive:
            return self._started
        worker = worker_for(self.environment, self.spec.text)
        options = {k: list(v) if isinstance(v, tuple) else v for k, v in self.options.items()}
        try:
            reply, _ = worker.request(
                "start",
                {"runtime": self.spec.name, "ep": self.ep, "options": options},
                doing=f"starting {self.spec.name}",
            )
        except (TconformError, WorkerCrashed):
            raise
        except Exception as exc:  # the release and tconform's runtime module do not agree
            raise UsageError(
                f"runtime spec {self.spec.text}: tconform cannot start {self.spec.name} in "
                f"{self.environment.python}: {first_line(exc)}"
            ) from None
        self._started = (worker, int(reply.pop("runtime")), reply)
        return self._started

    def _described(self) -> dict | None:
        """What the worker says of the runtime, or None where it died saying it."""
        try:
            return self._worker()[2]
        except WorkerCrashed as exc:
            self._start_crash = str(exc)
            return None

    @property
    def precision(self) -> str:
        """The precision the runtime in the worker reads back; where the worker cannot say (it
        crashed starting), the precision asked for: nothing runs, and opening says why."""
        described = self._described()
        if described is None:
            return "bfloat16" if self.options.get("bf16") else "float32"
        return str(described["precision"])

    @property
    def device_memory(self) -> bool:
        described = self._described()
        return bool(described and described["device_memory"])

    def settings(self) -> dict[str, object]:
        """The runtime's own settings, as the worker reads them, with the spec and the exact
        versions of its environment."""
        described = self._described()
        own = dict(described["settings"]) if described else {"worker_crashed": self._start_crash}
        return {
            **own,
            "spec": self.spec.text,
            "worker": {
                **self.environment.record(),
                "python_in_worker": described.get("python") if described else None,
            },
        }

    @property
    def python(self) -> str:
        return str(self.environment.python)

    def versions(self) -> dict[str, str | None]:
        """The exact versions in its environment (runtime package, numpy, onnx, Python)."""
        return {**self.environment.packages, "python": self.environment.python_version}

    def write_crash_bundle(
        self,
        message: str,
        model: Path,
        model_about: Mapping[str, object],
        external_data: Sequence[str],
        feeds: Mapping[str, np.ndarray] | None,
    ) -> Path | None:
        """The repro bundle of a crash on `model` (fed `feeds`, None where it crashed opening
        it), beside the command's reports; None where the command keeps none."""
        if self.crash_folder is None:
            return None
        described = self._described()
        about = {
            "runtime": self.spec.text,
            "runtime_name": self.spec.name,
            "ep": self.ep,
            "message": message,
            "python": str(self.environment.python),
            "versions": self.versions(),
            "settings": described["settings"] if described else dict(self.options),
            **model_about,
            "command": shlex.join(["tconform", *sys.argv[1:]]),
        }
        return write_crash_bundle(self.crash_folder, about, model, external_data, feeds)

    def open(self, model_path: Path) -> RemoteSession:
        worker, number, _ = self._worker()
        path = Path(model_path).absolute()
        reply, _ = worker.request(
            "open", {"runtime": number, "path": str(path)}, doing=f"opening {path.name}"
        )
        return RemoteSession(worker, self, path, reply)


@dataclass
class Handle:
    """A tensor kept in the worker, by number: what run_bound keeps, to_device copies and take
    gathers. Dropped here, it is freed there with the next request."""

    worker: WorkerProcess = field(repr=False)
    number: int
    dims: tuple[int, ...]
    dtype: np.dtype | None

    def shape(self) -> tuple[int, ...]:
        """Its shape (a method, as an OrtValue's is)."""
        return self.dims

    def __del__(self) -> None:
        if self.worker.alive:
            self.worker.released.append(self.number)


class RemoteSession(Session):
    """A session open in a worker, saying what the worker's session says."""

    def __init__(self, worker: WorkerProcess, runtime: RemoteRuntime, path: Path, about: dict):
        self.worker = worker
        self.runtime = runtime
        self.path = path
        self.number = int(about["session"])
        self.providers = list(about["providers"])
        self.placement = dict(about["placement"])
        self.fallback_ops = dict(about["fallback_ops"])
        self.precision = str(about["precision"])
        self.inputs = [
            TensorInfo(
                name,
                dtype_of(dtype) if dtype else None,
                rank,
                tuple(fixed) if fixed is not None else None,
            )
            for name, dtype, rank, fixed in about["inputs"]
        ]
        self.outputs = list(about["outputs"])
        self.notes = list(about["notes"])
        # Tensors it keeps live in the worker, whatever device they are on there.
        kind, index = about["device"]
        self.device = (f"worker:{kind}", int(index))

    def _request(self, op: str, header=None, tensors=None, doing="running it", seconds=None):
        try:
            return self.worker.request(
                op, {"session": self.number, **(header or {})}, tensors, doing, seconds
            )
        except WorkerCrashed as exc:  # which model it ran and with what, for its repro bundle
            exc.model_path = self.path
            exc.feeds = dict(tensors) if tensors is not None and op == "run" else None
            raise

    def run(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        wanted = list(outputs) if outputs else None
        _, values = self._request("run", {"outputs": wanted}, feeds)
        return values

    def run_bound(self, feeds: Mapping[str, object], keep: Collection[str]) -> dict[str, object]:
        """One run whose outputs named in `keep` stay in the worker (as Handles, fed back as
        they are); the others come back as arrays."""
        handles = {n: v.number for n, v in feeds.items() if isinstance(v, Handle)}
        arrays = {n: np.asarray(v) for n, v in feeds.items() if not isinstance(v, Handle)}
        reply, values = self._request(
            "run_bound", {"keep": sorted(keep), "handles": handles}, arrays
        )
        kept = {name: self._handle(value) for name, value in reply["kept"].items()}
        return {name: kept.get(name, values.get(name)) for name in self.outputs}

    def _handle(self, kept: list) -> Handle:
        number, dims, dtype = kept
        return Handle(self.worker, int(number), tuple(dims), dtype_of(dtype) if dtype else None)

    def to_device(self, array: np.ndarray) -> Handle:
        reply, _ = self._request("to_device", {}, {"array": np.asarray(array)})
        return self._handle(reply["kept"])

    def take(self, value: object, rows: np.ndarray, axis: int) -> object:
        if not isinstance(value, Handle):
            return super().take(value, rows, axis)
        reply, _ = self._request(
            "take", {"handle": value.number, "axis": axis}, {"rows": np.asarray(rows)}
        )
        return self._handle(reply["kept"])

    def timed_call(self, feeds: Mapping[str, np.ndarray], io_binding: bool = False) -> TimedCall:
        """The worker's own timed call: its loop runs there (`times`), so the pipe lies outside
        every timed run; its peak memory is the worker's."""
        reply, _ = self._request(
            "prepare", {"io_binding": io_binding}, dict(feeds), doing="preparing it for timing"
        )
        number = reply["call"]
        worker = self.worker

        def call(op: str, doing: str, budget: float | None = None, **header) -> dict:
            return worker.request(op, {"call": number, **header}, None, doing, budget)[0]

        def times(warmup: int, runs: int | None, seconds: float | None) -> list[float]:
            if runs is None:
                budget = seconds or 0.0
            else:  # one untimed run first, under the worker's own timeout: a model that hangs
                # is found within it, and the loop may take a generous multiple of that run
                once = call("times", "timing it", None, warmup=0, runs=1, seconds=None)
                budget = LOOP_SLACK * float(once["times"][0]) * (warmup + runs)
            found = call("times", "timing it", budget, warmup=warmup, runs=runs, seconds=seconds)
            return [float(t) for t in found["times"]]

        def memory() -> dict[str, object]:
            found = call("memory", "reading its memory")
            found.pop("device_memory_mb", None)
            return found

        def close() -> None:
            if worker.alive:
                call("finish", "closing the timed call")

        return TimedCall(
            lambda: call("call", "running it"),
            close,
            lambda: call("memory", "reading its memory").get("device_memory_mb"),
            dict(reply["details"]),
            times=times,
            memory=memory,
        )

    def op_profile(self, feeds: Mapping[str, np.ndarray]) -> dict[str, float] | None:
        reply, _ = self._request("profile", {}, dict(feeds), doing="profiling it")
        return reply["op_profile"]

    def close(self) -> None:
        """Closed in the worker; nothing to do where the worker has already ended."""
        if self.worker.alive:
            self._request("close", {}, None, doing="closing it")


def remote_runtime(
    spec: RuntimeSpec, cls: type, ep: str, options: dict[str, object]
) -> RemoteRuntime:
    """`cls` (a runtime class of RUNTIMES) as `spec` names it, in a worker; a runtime that runs
    a PyTorch module in tconform's process has no release to name."""
    package = getattr(cls, "package", None)
    if package is None or cls.consumes != "onnx":
        raise UsageError(
            f"runtime spec {spec.text}: {spec.name} runs in tconform's own process; a release or "
            "an interpreter is named for a runtime that opens ONNX files (onnxruntime, openvino, "
            "onnx-reference)"
        )
    accepted = {f.name for f in dataclasses.fields(cls)} - {"ep"}
    crash_folder = options.get("crash_folder")
    given = {k: v for k, v in options.items() if k in accepted}
    return RemoteRuntime(spec, ep, given, Path(crash_folder) if crash_folder else None, package)
