"""The interface every runtime implements, in the shape of Polygraphy's runners and onnx's
`Backend.prepare(model) -> BackendRep.run`:

    runtime = make_runtime("onnxruntime", "cpu", threads=2)   # how to open things
    session = runtime.open(target)            # an ONNX file, or a ModuleTarget
    outputs = session.run(feeds)              # a list, in the order of session.outputs

A runtime opens either ONNX files (`consumes = "onnx"`: ONNX Runtime, OpenVINO, ONNX's
reference evaluator) or PyTorch modules (`consumes = "module"`: torch eager, torch.compile).
A session says what really ran: the providers or devices (`providers`), where the nodes went
(`placement`, `fallback_ops`), the precision it computes in as the runtime itself reports it
(`precision`), and what it takes and returns (`inputs`, `outputs`).

Only the execution layer (tconform.execution) calls sessions; commands never do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from tconform.provenance import ModelProvenance


@dataclass(frozen=True)
class TensorInfo:
    """A session input as the session declares it: None where it declares nothing."""

    name: str
    dtype: np.dtype | None = None
    rank: int | None = None
    # the sizes the model fixes, per axis (None: free); None where it declares no shape
    fixed: tuple[int | None, ...] | None = None


@dataclass(frozen=True)
class ModuleTarget:
    """A PyTorch module to run: `build()` makes it (weights loaded); feeds are passed as
    `module(*[feeds[n] for n in args], **{n: feeds[n] for n in kwargs})`, the ones named in
    `floats` cast to the runtime's dtype; `outputs` names what it returns, flattened
    (tconform.runtimes.torch.flatten_outputs)."""

    build: Callable[[], Any]
    args: tuple[str, ...]
    kwargs: tuple[str, ...] = ()
    floats: frozenset[str] = frozenset()
    outputs: tuple[str, ...] = ()


def select(names: list[str], values: list, wanted: Sequence[str] | None) -> list:
    """`values` (one per name of `names`) of the names in `wanted`, in that order (all where
    `wanted` is None)."""
    if wanted is None:
        return values
    at = {name: i for i, name in enumerate(names)}
    return [values[at[name]] for name in wanted]


@dataclass
class TimedCall:
    """One prepared forward pass for timing (bench): `run()` does it, finished on the device."""

    run: Callable[[], object]
    close: Callable[[], None] = lambda: None
    device_memory_mb: Callable[[], float | None] = lambda: None
    details: dict[str, object] = field(default_factory=dict)
    # Where the runs happen in another process (a worker, tconform.runtimes.remote), it times
    # them itself, with nothing between the runs: (warmup, runs, seconds) -> the seconds of each
    # timed run, as tconform.runtimes.timing.timed_runs gives them. None: the caller loops.
    times: Callable[[int, int | None, float | None], list[float]] | None = None
    # ... and says that process's peak memory: {"peak_mem_mb", "peak_mem_delta_mb",
    # "peak_mem_method"}. None: the caller's own process is where the runs happen.
    memory: Callable[[], dict[str, object]] | None = None


class Session:
    """An opened model. A runtime's session sets the attributes below and implements `run`;
    the methods after it have host-memory defaults that a runtime with device memory replaces."""

    providers: list[str]  # what really ran, as the runtime reports it
    placement: dict[str, int]  # provider or device -> nodes (empty where the runtime says none)
    fallback_ops: dict[str, int]  # op type -> nodes left on the CPU by another provider
    precision: str  # what it computes in, read back from the runtime where it says
    inputs: list[TensorInfo]
    outputs: list[str]
    provenance: ModelProvenance | None = None  # a module's; a file's is the subject's
    notes: list[str]  # facts about this session worth knowing on every result
    device: tuple[str, int] = ("cpu", 0)  # where `run_bound` keeps outputs ("cpu": the host)

    def run(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> list[np.ndarray]:
        """The outputs named in `outputs` (default: all, in `self.outputs`' order); a runtime
        that can compute only those (ONNX Runtime) keeps no other tensor."""
        raise NotImplementedError

    def run_bound(self, feeds: Mapping[str, object], keep: set[str]) -> dict[str, object]:
        """One run whose outputs named in `keep` stay where the session keeps tensors (its
        device), ready to be fed back; on the host this is `run`."""
        return dict(zip(self.outputs, self.run(feeds), strict=True))

    def to_device(self, array: np.ndarray) -> object:
        """`array` where `run_bound` takes its inputs."""
        return array

    def take(self, value: object, rows: np.ndarray, axis: int) -> object:
        """`value` (as `run_bound` keeps it) with `rows` taken along `axis`, left where it lies:
        beam search's reorder of a cache that stays on the device."""
        return np.take(np.asarray(value), rows, axis=axis)

    def timed_call(self, feeds: Mapping[str, np.ndarray], io_binding: bool = False) -> TimedCall:
        """A forward pass on fixed feeds, prepared for timing."""
        fixed = dict(feeds)
        return TimedCall(lambda: self.run(fixed))

    def close(self) -> None:
        """Release what the session holds (compiled graphs, device buffers)."""


class Runtime(Protocol):
    name: ClassVar[str]  # its key in tconform.runtimes.RUNTIMES
    consumes: ClassVar[str]  # "onnx" (opens a model file) or "module" (opens a ModuleTarget)
    eps: ClassVar[tuple[str, ...]]  # the devices or execution providers it can run on
    ep: str

    @property
    def precision(self) -> str:
        """What it is asked to compute in ("float32", "tf32", "bfloat16", ...)."""
        ...

    def settings(self) -> dict[str, object]: ...

    def open(self, target) -> Session: ...
