"""The one execution layer: every command runs a model here, the same way, with the same
promises (in the spirit of Polygraphy's `Comparator.run` over its runners).

    results = execute(runtime, subject, input_sets, judge, row)

1. Open. The runtime opens the part of the subject it consumes (an ONNX file or a PyTorch
   module). A provider that cannot run is `unavailable` and a missing kernel `skip`, each with
   the runtime's own reason, never a pass. The file is re-hashed once the session has read it,
   so a result never names bytes other than those that ran.
2. Feed. Each input set is matched to what the session declares: by name (by position where a
   model made elsewhere names its inputs otherwise); floats are rounded to the declared float
   type; any other type, or a rank, that differs is a usage error in every command.
3. Run. An exception on valid input is `error` (a conformance failure): the one line of it.
4. Judge. The judge compares the outputs; nothing compared (no output with an element) is
   never a pass.
5. Stamp. Every result carries what really ran: the providers, the node placement and CPU
   fallbacks (`--strict-placement` fails them), the precision the session computed in and the
   provenance of the exact bytes or module.

`open_subject` is the same first step for callers that run a session their own way
(generation's decoding loop, bench's timing); they get an `Opened`, never the runtime's session.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from tconform.compare import OutputComparison, is_float_dtype
from tconform.config import ModelConfig
from tconform.errors import (
    NATIVE_CALLS,
    KernelMissing,
    ProviderUnavailable,
    RuntimeRejected,
    RuntimeTooOld,
    TconformError,
    Terminated,
    UsageError,
    WorkerCrashed,
    first_line,
)
from tconform.fp16 import float16_notes
from tconform.models import ModelUnderTest
from tconform.provenance import ModelProvenance
from tconform.registry import Case
from tconform.results import Result, Status
from tconform.runtimes import ModuleTarget, Runtime, Session, TensorInfo, TimedCall, label
from tconform.weights import load_params


@dataclass(frozen=True)
class Subject:
    """One thing under test, as each kind of runtime consumes it: the ONNX file (ONNX Runtime,
    OpenVINO, onnx.reference) and the PyTorch module (torch, torch.compile)."""

    onnx: ModelUnderTest | None = None
    module: ModuleTarget | None = None


def case_module(case: Case, cfg: ModelConfig, params: Mapping[str, np.ndarray]) -> ModuleTarget:
    """A registry case's reference module with these weights, as the torch runtimes open it."""
    inputs, outputs = case.inputs(cfg), case.outputs(cfg)
    return ModuleTarget(
        lambda: load_params(case.build(cfg), dict(params)),
        args=tuple(spec.name for spec in inputs),
        floats=frozenset(spec.name for spec in inputs if spec.kind == "float"),
        outputs=tuple(spec.name for spec in outputs),
    )


class InputSet(Protocol):
    """Named inputs and the expected outputs by name (tconform.golden.InputSet is one)."""

    name: str
    inputs: Mapping[str, np.ndarray]
    outputs: Mapping[str, np.ndarray]


# (outputs by name, the input set, the precision it ran in) -> one comparison per judged output
Judge = Callable[[dict[str, np.ndarray], InputSet, str], list[OutputComparison]]


@dataclass(frozen=True)
class BatchRows:
    """Batch consistency: an input set run whole and then row by row, each row of the whole
    run's outputs judged against the run of that row alone (the runtime is its own reference:
    "row i of a batch equals the run on row i alone"). `rows`: the batch size; an input without
    an axis in `batch_axes` is shared by every row. An output is judged along its own row axis
    (`row_axis`: a sequence-first module's outputs hold the batch on axis 1); one without a
    single such axis is not judged."""

    name: str
    inputs: Mapping[str, np.ndarray]
    batch_axes: Mapping[str, int]
    rows: int
    outputs: Mapping[str, np.ndarray] = field(default_factory=dict)  # filled by the runs
    # Outputs not judged: the reference itself mixes the batch's rows in them (a module that
    # centres its batch), so a row run alone is rightly another value
    mixed: tuple[str, ...] = ()

    def row(self, k: int) -> dict[str, np.ndarray]:
        return {
            name: np.take(value, [k], axis=self.batch_axes[name])
            if name in self.batch_axes
            else value
            for name, value in self.inputs.items()
        }


class FixedDimension(Exception):
    """An input set whose shape the model cannot take: the export fixed a dimension."""


class OutputsMismatch(UsageError):
    """A session returned another number of outputs than it declares."""


class NotRun(Exception):
    """The subject could not be opened on the runtime: `unavailable` (the provider cannot run
    here), `skip` (no kernel for its type) or `error` (the runtime broke opening it)."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status


def precision_of(runtime_precision: str, model: ModelUnderTest | None) -> str:
    """The precision a run computes in, which picks its tolerance row: a model that computes
    in a narrower type than float32 says so itself (float16, bfloat16, int8: its own graph
    rounds to it, whatever the runtime); otherwise what the runtime computes in (tf32 on
    CUDA, bfloat16 on OpenVINO when asked, float32)."""
    if model is not None and model.precision != "float32":
        return model.precision
    return runtime_precision


@dataclass
class Opened:
    """A subject open on a runtime: the only handle commands get. It runs with the feeds
    checked against what the session declares, and stamps results with what really ran."""

    runtime: Runtime
    subject: Subject
    session: Session = field(repr=False)

    @property
    def onnx_file(self) -> bool:
        return self.runtime.consumes == "onnx"

    @property
    def precision(self) -> str:
        return precision_of(self.session.precision, self.subject.onnx if self.onnx_file else None)

    @property
    def provenance(self) -> ModelProvenance | None:
        if self.onnx_file:
            return self.subject.onnx.provenance
        return self.session.provenance

    @property
    def outputs(self) -> list[str]:
        return self.session.outputs

    @property
    def device(self) -> tuple[str, int]:
        return self.session.device

    @functools.cached_property
    def _precision_notes(self) -> list[str]:
        """What a float16 run must be read with (tconform.fp16): mask fills half precision
        turned into -inf, and on ONNX Runtime's CPU provider the ops it ran in float32."""
        if not self.onnx_file or self.precision != "float16":
            return []
        ep = self.runtime.ep if self.runtime.name == "onnxruntime" else ""
        return float16_notes(self.subject.onnx.path, ep)

    @property
    def notes(self) -> list[str]:
        notes = list(self.subject.onnx.notes) if self.onnx_file else []
        notes += self._precision_notes
        model = self.subject.onnx
        if self.onnx_file and model.provenance.compute_note:
            notes.append(model.provenance.compute_note)
        if self.onnx_file and model.precision != model.io_type:
            notes.append(
                f"{model.provenance.compute_elem_type} computation with {model.io_type} inputs "
                f"and outputs: judged by the {self.precision} tolerance row"
            )
        notes += self.session.notes
        if self.session.fallback_ops:
            ops = ", ".join(f"{op} x{n}" for op, n in sorted(self.session.fallback_ops.items()))
            notes.insert(0, f"warning: nodes fell back to the CPU provider: {ops}")
        return notes

    def feeds(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`inputs` as the session takes them (see `match_feeds`)."""
        where = self.subject.onnx.path if self.onnx_file else label(self.runtime)
        return match_feeds(self.session.inputs, inputs, str(where))

    def run(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """The outputs (all, or those named, in that order) for `inputs`, by name."""
        return interruptible(self.session.run, self.feeds(inputs), outputs)

    def run_bound(self, feeds: Mapping[str, object], keep: set[str]) -> dict[str, object]:
        return interruptible(self.session.run_bound, feeds, keep)

    def to_device(self, array: np.ndarray) -> object:
        return self.session.to_device(array)

    def take(self, value: object, rows: np.ndarray, axis: int) -> object:
        return self.session.take(value, rows, axis)

    def timed_call(self, inputs: Mapping[str, np.ndarray], io_binding: bool = False) -> TimedCall:
        """One prepared forward pass on `inputs`; FixedDimension where the model fixes a
        dimension they have otherwise (named as such, not left to the runtime's first error)."""
        feeds = self.feeds(inputs)
        require_free_dimensions(self.session.inputs, feeds)
        return self.session.timed_call(feeds, io_binding)

    def op_profile(self, inputs: Mapping[str, np.ndarray]) -> dict[str, float] | None:
        """Kernel milliseconds per op type, where the runtime profiles (None elsewhere)."""
        return self.session.op_profile(self.feeds(inputs))

    def stamp(self, row: Result) -> Result:
        """A copy of `row` naming what ran: providers, placement, precision, model, notes."""
        return replace(
            row,
            runtime=self.runtime.name,
            ep=self.runtime.ep,
            ep_actual=list(self.session.providers),
            placement=dict(self.session.placement),
            fallback_ops=dict(self.session.fallback_ops),
            precision=self.precision,
            model=self.provenance,
            notes=[*self.notes, *row.notes],
            outputs=[],
        )


def interruptible(call: Callable, *args: object):
    """call(*args), in a helper thread while the main thread waits for it. Python runs its
    signal handlers in the main thread between bytecodes, so a runtime's native call that
    never returns (a Loop with no end) would hold Ctrl-C and SIGTERM off for good; a waiting
    Event is interrupted by them, and the run ends with its reports (exit 130 or 143), leaving
    the helper (a daemon) to the process's exit (tconform.errors.NATIVE_CALLS)."""
    if threading.current_thread() is not threading.main_thread():
        return call(*args)
    ended: dict[str, object] = {}
    returned = threading.Event()

    def target() -> None:
        try:
            ended["value"] = call(*args)
        except BaseException as exc:  # raised again in the caller's thread, as it was
            ended["error"] = exc
        finally:
            NATIVE_CALLS.discard(returned)
            returned.set()

    NATIVE_CALLS.add(returned)
    threading.Thread(target=target, name="tconform-run", daemon=True).start()
    returned.wait()
    if "error" in ended:
        raise ended["error"]  # type: ignore[misc]
    return ended["value"]


@contextlib.contextmanager
def open_subject(runtime: Runtime, subject: Subject) -> Iterator[Opened]:
    """`subject` open on `runtime` for the block; NotRun when it cannot be, for a reason that is
    the environment's (a provider absent, a kernel missing); UsageError for a subject the runtime
    cannot take at all (a file it cannot read)."""
    if runtime.consumes == "onnx":
        target = subject.onnx.path if subject.onnx is not None else None
    else:
        target = subject.module
    if target is None:
        needs = "an ONNX model" if runtime.consumes == "onnx" else "a PyTorch module"
        raise UsageError(f"{label(runtime)} needs {needs}, and this check has none")
    try:
        session = runtime.open(target)
    except ProviderUnavailable as exc:
        raise NotRun(Status.UNAVAILABLE, str(exc)) from None
    except (KernelMissing, RuntimeTooOld) as exc:  # facts about the runtime, not failures
        raise NotRun(Status.SKIP, str(exc)) from None
    except WorkerCrashed as exc:  # the runtime's process died opening it: its verdict
        raise NotRun(Status.CRASH, crash_message(runtime, subject, None, exc)) from None
    except RuntimeRejected as exc:  # a well-formed model this runtime cannot take: its failure
        raise NotRun(Status.ERROR, f"{label(runtime)}: {exc}") from None
    except TconformError:
        raise
    except Exception as exc:  # the runtime broke on a model it accepted: its failure
        why = f"{label(runtime)} failed to open it: {first_line(exc)}"
        raise NotRun(Status.ERROR, why) from None
    try:
        if runtime.consumes == "onnx":
            subject.onnx.confirm_unchanged()  # the session holds exactly the bytes named
        yield Opened(runtime, subject, session)
    finally:
        session.close()


def crash_message(
    runtime: Runtime, subject: Subject, feeds: Mapping[str, np.ndarray] | None, exc: WorkerCrashed
) -> str:
    """A crash's one line, naming its repro bundle (the model and `feeds`) where the runtime
    writes one (a runtime in a worker, with a folder beside the command's reports)."""
    message = str(exc)
    model = subject.onnx
    if model is None:
        return message
    about = {"model": str(model.path), "sha256": model.provenance.sha256}
    try:
        folder = runtime.write_crash_bundle(
            message, model.path, about, model.provenance.external_data, feeds
        )
    except OSError as error:
        return f"{message} (its repro bundle could not be written: {error})"
    return f"{message}; repro bundle: {folder}" if folder else message


def not_run(row: Result, runtime: Runtime, subject: Subject, why: NotRun) -> Result:
    """The result of a subject that could not be opened, at the precision it would have run."""
    model = subject.onnx if runtime.consumes == "onnx" else None
    return replace(
        row,
        runtime=runtime.name,
        ep=runtime.ep,
        status=str(why.status),
        message=str(why),
        precision=precision_of(runtime.precision, model),
        model=model.provenance if model else row.model,
    )


def match_feeds(
    declared: Sequence[TensorInfo], inputs: Mapping[str, np.ndarray], where: str
) -> dict[str, np.ndarray]:
    """The inputs a session declares, from `inputs`: by name, or by position when the session
    names them otherwise (a model exported elsewhere) and the counts agree. Floats are rounded
    to the declared float type; any other element type, or a rank, that differs from the
    declaration is a usage error naming the input."""
    wanted = [info.name for info in declared]
    if set(wanted) <= set(inputs):
        named = {name: inputs[name] for name in wanted}
    elif len(wanted) == len(inputs):
        named = dict(zip(wanted, inputs.values(), strict=True))
    else:
        raise UsageError(
            f"{where}: takes inputs {', '.join(wanted) or 'none'}; it is given "
            f"{', '.join(inputs) or 'none'}"
        )
    feeds = {}
    for info in declared:
        value = np.asarray(named[info.name])
        if info.dtype is not None and value.dtype != info.dtype:
            if is_float_dtype(info.dtype) and is_float_dtype(value.dtype):
                value = value.astype(info.dtype)
            else:
                raise UsageError(
                    f"{where}: input {info.name!r} is {info.dtype}; it is given {value.dtype}"
                )
        if info.rank is not None and value.ndim != info.rank:
            raise UsageError(
                f"{where}: input {info.name!r} has rank {info.rank}; it is given rank "
                f"{value.ndim} (shape {list(value.shape)})"
            )
        feeds[info.name] = value
    return feeds


def settle(result: Result, comparisons: list[OutputComparison]) -> Result:
    """`result`'s verdict from its comparisons: fail if any fails; nothing compared (no output
    holding an element) is `skip`, never a pass, and so is each output that compared nothing.
    What a comparison notes of its tolerance (an atol scaled to the output, or one above it)
    joins the result's notes."""
    for comparison in comparisons:
        if comparison.status == "pass" and comparison.unseen():
            comparison.status, comparison.message = "skip", comparison.unseen()
    result.outputs = comparisons
    result.notes += [c.note for c in comparisons if c.note and c.note not in result.notes]
    left_out = sum(c.excluded for c in comparisons)
    if left_out:  # the padding mask's zeros (check --padding-mask)
        total = sum(c.compared + c.excluded for c in comparisons)
        result.notes.append(
            f"{result.input_set}: {left_out} of {total} output elements left out (padded positions)"
        )
    failed = [c for c in comparisons if c.status == "fail"]
    if failed:
        result.status = str(Status.FAIL)
        result.message = "; ".join(f"{c.name}: {c.message}" for c in failed)
    elif all(c.status == "skip" for c in comparisons):
        result.status = str(Status.SKIP)
        result.message = "nothing compared: " + (
            "; ".join(f"{c.name}: {c.message}" for c in comparisons)
            if comparisons
            else "no output was judged"
        )
    else:
        result.status, result.message = str(Status.PASS), ""
    return result


def require_free_dimensions(
    declared: Sequence[TensorInfo], feeds: Mapping[str, np.ndarray], way_on: str = ""
):
    """FixedDimension where a feed's size differs from one the model fixes (an export made at
    one shape, asked to run at another), saying `way_on`, else tconform's option that frees
    the axis."""
    for info in declared:
        value = feeds.get(info.name)
        if info.fixed is None or value is None or value.ndim != len(info.fixed):
            continue
        for axis, (fixed, size) in enumerate(zip(info.fixed, value.shape, strict=True)):
            if fixed is not None and fixed != size:
                way = way_on or f"tconform check --dynamic {info.name}={axis}:NAME exports it free"
                raise FixedDimension(
                    f"the model fixes input {info.name!r} axis {axis} at {fixed} and this input "
                    f"set has {size}: the export kept that dimension static ({way})"
                )


def _outputs(opened: Opened, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    outputs = interruptible(opened.session.run, feeds)
    if list(outputs) != list(opened.outputs):
        raise OutputsMismatch(
            f"{label(opened.runtime)}: returned {len(outputs)} outputs ({', '.join(outputs)}); "
            f"it declares {len(opened.outputs)} ({', '.join(opened.outputs)})"
        )
    return outputs


def row_axis(whole: Sequence[int], part: Sequence[int], rows: int, part_rows: int) -> int | None:
    """The one axis along which an output of shape `whole` (a batch of `rows`) holds the rows
    that an output of shape `part` (`part_rows` of them) holds, the other sizes equal; None
    where no axis or more than one fits (a (batch, batch) similarity, CLIP's
    logits_per_image, pairs the rows by design)."""
    if len(whole) != len(part):
        return None
    fits = [
        axis
        for axis in range(len(whole))
        if whole[axis] == rows
        and part[axis] == part_rows
        and all(w == p for k, (w, p) in enumerate(zip(whole, part, strict=True)) if k != axis)
    ]
    return fits[0] if len(fits) == 1 else None


def rows_run_alone(opened: Opened, batched: BatchRows, whole: Mapping[str, np.ndarray]):
    """`batched` with its expected outputs: each output of the whole run (`whole`) rebuilt
    from the runs of one row at a time, along its own row axis. Only an output that splits by
    row is judged: one whose run on a row alone has the whole's shape but for a 1 on one axis
    where the whole has the batch."""
    runs = [_outputs(opened, opened.feeds(batched.row(k))) for k in range(batched.rows)]
    expected = {}
    for name, value in whole.items():
        shapes = {np.shape(run[name]) for run in runs}
        if name in batched.mixed or len(shapes) != 1:
            continue
        axis = row_axis(np.shape(value), shapes.pop(), batched.rows, 1)
        if axis is not None:
            expected[name] = np.concatenate([run[name] for run in runs], axis=axis)
    return replace(batched, outputs=expected)


def run_judged(opened: Opened, input_set: InputSet, judge: Judge, row: Result) -> Result:
    """One input set through an opened subject, judged: pass, fail, error or skip (a shape the
    model cannot take is a skip naming the fixed dimension, never a pass)."""
    result = opened.stamp(replace(row, input_set=input_set.name))
    feeds = opened.feeds(input_set.inputs)  # a signature mismatch is a usage error, raised
    started = time.perf_counter()
    try:
        model = opened.subject.onnx
        require_free_dimensions(opened.session.inputs, feeds, model.fixed_way_on if model else "")
        outputs = _outputs(opened, feeds)
        if isinstance(input_set, BatchRows):
            input_set = rows_run_alone(opened, input_set, outputs)
    except FixedDimension as exc:
        result.status, result.message = str(Status.SKIP), str(exc)
    except (KeyboardInterrupt, Terminated, OutputsMismatch):
        raise
    except WorkerCrashed as exc:  # the runtime's process died on valid input: its verdict
        result.status = str(Status.CRASH)
        result.message = crash_message(opened.runtime, opened.subject, feeds, exc)
    except BaseException as exc:  # a runtime (or a user's forward) failing on valid input
        result.status, result.message = str(Status.ERROR), first_line(exc)
    else:
        settle(result, judge(outputs, input_set, result.precision))
    result.seconds = time.perf_counter() - started
    return result


def execute(
    runtime: Runtime,
    subject: Subject,
    input_sets: Sequence[InputSet],
    judge: Judge,
    row: Result,
    strict_placement: bool = False,
) -> list[Result]:
    """One result per input set of `subject` on `runtime`, judged by `judge`. `row` holds what
    the caller knows of every result (case, component, cell, reference, notes). After a crash
    the subject is opened again (a new worker) for the input sets still to run."""
    results: list[Result] = []
    remaining = list(input_sets)
    while remaining:
        try:
            with open_subject(runtime, subject) as opened:
                while remaining:
                    results.append(run_judged(opened, remaining.pop(0), judge, row))
                    if results[-1].status == Status.CRASH:
                        break
        except NotRun as why:
            results += [
                not_run(replace(row, input_set=s.name), runtime, subject, why) for s in remaining
            ]
            break
    if strict_placement:
        require_placement(results)
    return results


def require_placement(results: list[Result]) -> None:
    """--strict-placement: a passing result any of whose nodes fell back to another provider
    fails, naming the fallback (its first note)."""
    for result in results:
        if result.fallback_ops and result.status == Status.PASS:
            result.status = str(Status.FAIL)
            result.message = f"{result.notes[0]} (--strict-placement)"
