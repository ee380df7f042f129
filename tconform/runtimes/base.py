"""The interface every runtime implements, in the shape of Polygraphy's runners and onnx's
`Backend.prepare(model) -> BackendRep.run`:

    runtime = make_runtime("onnxruntime", "cpu", threads=2)   # how to open things
    session = runtime.open(target)            # an ONNX file, or a ModuleTarget
    outputs = session.run(feeds)              # {name: array}, in the order of session.outputs

A runtime opens either ONNX files (`consumes = "onnx"`: ONNX Runtime, OpenVINO, ONNX's
reference evaluator) or PyTorch modules (`consumes = "module"`: torch eager, torch.compile).
A session says what really ran: the providers or devices (`providers`), where the nodes went
(`placement`, `fallback_ops`), the precision it computes in as the runtime itself reports it
(`precision`), and what it takes and returns (`inputs`, `outputs`).

Only the execution layer (tconform.execution) calls sessions; commands never do.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

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
    (tconform.runtimes.torch_session.flatten_outputs)."""

    build: Callable[[], Any]
    args: tuple[str, ...]
    kwargs: tuple[str, ...] = ()
    floats: frozenset[str] = frozenset()
    outputs: tuple[str, ...] = ()


def select(names: list[str], values: list, wanted: Sequence[str] | None) -> dict[str, np.ndarray]:
    """`values` (one per name of `names`) by name: those named in `wanted`, in that order (all,
    in their own order, where `wanted` is None). Values beyond the names are named by position
    ("output 3") and missing ones left out, so that the execution layer names the mismatch."""
    named = {names[i] if i < len(names) else f"output {i}": value for i, value in enumerate(values)}
    return named if wanted is None else {name: named[name] for name in wanted}


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
    ) -> dict[str, np.ndarray]:
        """The outputs named in `outputs` (default: all, in `self.outputs`' order), by name; a
        runtime that can compute only those (ONNX Runtime) keeps no other tensor."""
        raise NotImplementedError

    def run_bound(self, feeds: Mapping[str, object], keep: set[str]) -> dict[str, object]:
        """One run whose outputs named in `keep` stay where the session keeps tensors (its
        device), ready to be fed back; on the host this is `run`."""
        return dict(self.run(feeds))

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

    def op_profile(self, feeds: Mapping[str, np.ndarray]) -> dict[str, float] | None:
        """Kernel milliseconds per op type, where the runtime profiles its runs (None here)."""
        return None

    def close(self) -> None:
        """Release what the session holds (compiled graphs, device buffers)."""


@dataclass(frozen=True)
class RuntimeOption:
    """An option a runtime declares (Runtime.options): it sets the runtime's field `field`, and
    every command that takes runtimes offers it as `flag` (tconform.commands.options reads the
    declarations, so a new option is a change in its runtime's module alone). `kind` is bool (a
    flag), int (within `bounds`), a tuple of the values it may take, or dict (KEY=VALUE,
    repeatable). The default is the field's. `eps`: the providers it acts on (empty: every one);
    on no other does it change anything."""

    field: str
    flag: str
    help: str
    kind: type | tuple[str, ...] = bool
    bounds: tuple[int, int] | None = None
    eps: tuple[str, ...] = ()

    def problem(self, value: object) -> str:
        """What is wrong with `value` for this option ('' when nothing): the command line's
        types check the same for its flags."""
        if isinstance(self.kind, tuple):
            ok = value in self.kind
            wanted = f"one of {', '.join(self.kind)}"
        elif self.kind is int:
            low, high = self.bounds or (0, 2**31 - 1)
            ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
            wanted = f"an integer in {low}..{high}"
        elif self.kind is bool:
            ok = value is None or isinstance(value, bool)
            wanted = "True, False or None"
        else:
            ok = isinstance(value, dict)
            wanted = "a dict"
        return "" if ok else f"{value!r} is not {wanted}"


class Runtime:
    """How to open models on one provider. Every runtime subclasses it as a dataclass whose
    fields are the options it takes (tconform.runtimes.takes_option; those a user sets, it
    declares in `options`) and declares here what it is and what it can do; the defaults are
    those of a runtime in tconform's own process that keeps tensors on the host. Callers read
    these, never probe for them."""

    name: ClassVar[str]  # its key in tconform.runtimes.RUNTIMES
    consumes: ClassVar[str]  # "onnx" (opens a model file) or "module" (opens a ModuleTarget)
    eps: ClassVar[tuple[str, ...]]  # the devices or execution providers it can run on
    # A deployment target, which bench times (ONNX's reference evaluator is not one)
    timed: ClassVar[bool] = True
    # The options it takes from the command line, each a field of the class
    options: ClassVar[tuple[RuntimeOption, ...]] = ()
    ep: str

    @property
    def precision(self) -> str:
        """What it is asked to compute in ("float32", "tf32", "bfloat16", ...)."""
        raise NotImplementedError

    @property
    def device_memory(self) -> bool:
        """Whether it keeps tensors in memory of its own device between runs: bench's IO-binding
        rows and the generation cache bound there."""
        return False

    @property
    def python(self) -> str:
        """The interpreter it runs in (a worker's, for a runtime out of process)."""
        return sys.executable

    def settings(self) -> dict[str, object]:
        raise NotImplementedError

    def open(self, target) -> Session:
        raise NotImplementedError

    def versions(self) -> dict[str, str | None] | None:
        """The exact packages it runs with where they are not tconform's own (a worker's
        environment); None: those of the report's environment."""
        return None

    def write_crash_bundle(
        self,
        message: str,
        model: Path,
        model_about: Mapping[str, object],
        external_data: Sequence[str],
        feeds: Mapping[str, np.ndarray] | None,
    ) -> Path | None:
        """The repro bundle of a crash of its process on `model`; None where it keeps none (a
        runtime in tconform's process cannot crash and leave a report)."""
        return None
