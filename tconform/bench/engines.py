"""The engines a bench run times: every runtime of tconform.runtimes.RUNTIMES that is a
deployment target, opened through the execution layer. Graph variants (GRAPH_VARIANTS) are the
engines that run one export on one runtime: ONNX Runtime on the plain, sdpa, optimizer-fused
and int8 graphs (on CUDA the plain one also with IO binding), OpenVINO on the plain graph at
its bfloat16 inference precision; the other ONNX runtimes (OpenVINO at float32) run the plain
export; the module runtimes (PyTorch eager, torch.compile, torch's dynamic int8) the reference
module. Each engine is opened once, gives back one call that runs a forward pass on fixed
inputs, and is closed before the next opens, so that its peak memory is its own."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial

import numpy as np

from tconform.bench.fusions import fused_model, fused_op_counts
from tconform.bench.weights import module_weight_bytes, onnx_weight_bytes
from tconform.config import ModelConfig
from tconform.errors import UsageError, WorkerCrashed
from tconform.execution import (
    NotRun,
    Opened,
    Subject,
    case_module,
    crash_message,
    open_subject,
)
from tconform.models import ModelUnderTest, derived_file
from tconform.registry import Case
from tconform.results import Status
from tconform.runtimes import RUNTIMES, Runtime, TimedCall, runtime_class
from tconform.runtimes.specs import base_name, parse_spec, spec_suffix


@dataclass(frozen=True)
class GraphVariant:
    """One export one runtime is timed on: the export's attention kernel and dtype, whether
    the onnxruntime.transformers optimizer rewrote it (bench/fusions.py), and the runtime's
    options (`precision`: what the runtime must read back for them, where they ask for a
    reduced precision that a CPU may not have)."""

    runtime: str = "onnxruntime"
    attention: str = "plain"
    dtype: str = "float32"
    optimizer: bool = False
    options: tuple[tuple[str, object], ...] = ()
    precision: str | None = None

    @property
    def export(self) -> tuple[str, str]:
        """The export it runs: (attention kernel, dtype)."""
        return (self.attention, self.dtype)


PLAIN_EXPORT = ("plain", "float32")
# Every graph variant, in report order; the plain ONNX Runtime export is the baseline every
# variant's gain is measured against, and each variant's own rows enter `best`.
GRAPH_VARIANTS = {
    "onnxruntime": GraphVariant(),
    "onnxruntime-sdpa": GraphVariant(attention="sdpa"),
    "onnxruntime-fused": GraphVariant(optimizer=True),
    # onnxruntime.quantization.quantize_dynamic of the float32 export (tconform export --dtype
    # int8): int8 weights, activations quantised per call
    "onnxruntime-int8": GraphVariant(dtype="int8"),
    # OpenVINO's bf16 inference precision on the float32 export: where the CPU has no bf16
    # kernels (AVX512-BF16, AMX) OpenVINO compiles float32 instead, and the row says so
    "openvino-bf16": GraphVariant("openvino", options=(("bf16", True),), precision="bfloat16"),
}
BASELINE = "onnxruntime"
IO_BINDING = "onnxruntime-iobinding"  # the baseline with IO binding, where a device has memory


class EngineUnavailable(RuntimeError):
    """The engine cannot run as itself here (a reduced precision the CPU lacks): the row
    says why and nothing is timed."""


def timed_runtimes() -> tuple[str, ...]:
    """The runtimes other than ONNX Runtime (whose variants stand for it) that a bench times:
    all but those that are not deployment targets (onnx.reference)."""
    return tuple(
        name
        for name in RUNTIMES
        if name != BASELINE and getattr(runtime_class(name), "timed", True)
    )


def engine_names() -> tuple[str, ...]:
    return (*GRAPH_VARIANTS, *timed_runtimes())


# onnxruntime-fused is opt-in: ONNX Runtime's own session-time fusions already do what the
# optimizer adds on these graphs (docs/performance.md); OpenVINO is opt-in (an optional
# package); the int8 engines are opt-in: they compute in another precision (their own
# tolerance row), and the int8 export is one more export of every case.
DEFAULT_ENGINES = ("onnxruntime", "onnxruntime-sdpa", "torch", "torch-compile")


def parse_engines(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The requested engines in canonical order (the default engines when none is named). An
    engine may name a release or an interpreter of its runtime as a runtime spec does
    (onnxruntime==1.20.1, onnxruntime-sdpa==1.20.1, openvino@/opt/py/bin/python): it runs in a
    worker (tconform.runtimes.remote), after the engine it is a version of."""
    known = engine_names()
    for name in names:
        try:
            spec = parse_spec(name)
        except ValueError as exc:
            raise UsageError(f"engine {exc}") from None
        if spec.name not in known:
            raise UsageError(f"unknown engine {spec.name!r}; choose from {', '.join(known)}")
    given = [parse_spec(name).text for name in names]
    return (
        tuple(e for base in known for e in dict.fromkeys(given) if base_name(e) == base)
        if names
        else DEFAULT_ENGINES
    )


def engine_runtime(engine: str) -> str:
    """The runtime (a name or spec) an engine runs on: its graph variant's, else its own
    (onnxruntime-sdpa==1.20.1 -> onnxruntime==1.20.1)."""
    variant = GRAPH_VARIANTS.get(base_name(engine))
    return (variant.runtime if variant else base_name(engine)) + spec_suffix(engine)


Opener = Callable[[], TimedCall]
# (runtime name, ep, options) -> that runtime as the bench configures it (threads, session
# settings, and the options a variant adds)
RuntimeFor = Callable[..., Runtime]


def engine_openers(
    engines: tuple[str, ...],
    eps: tuple[str, ...],
    case: Case,
    cfg: ModelConfig,
    params: dict[str, np.ndarray],
    feeds: dict[str, np.ndarray],
    models: dict[tuple[str, str], ModelUnderTest],
    runtime_for: RuntimeFor,
) -> list[tuple[str, str, Opener]]:
    """(engine, provider, opener) for each of `engines` on each of `eps`, in report order.
    `models` maps an export (attention kernel, dtype) to `case`'s model exported so."""
    openers: list[tuple[str, str, Opener]] = []
    module = case_module(case, cfg, params)
    for ep in eps:
        for engine in engines:
            variant = GRAPH_VARIANTS.get(base_name(engine))
            name = engine_runtime(engine)
            if ep not in runtime_class(name).eps:
                continue
            runtime = runtime_for(name, ep, **dict(variant.options if variant else ()))
            model = models.get(variant.export if variant else PLAIN_EXPORT)
            details = {"attention": variant.attention, "dtype": variant.dtype} if variant else {}
            if variant is not None and variant.optimizer:
                opener = partial(_open_fused, runtime, model, cfg, feeds)
            else:
                opener = partial(
                    open_engine, runtime, Subject(model, module), feeds, details,
                    precision=variant.precision if variant else None,
                )  # fmt: skip
            openers.append((engine, ep, opener))
            if base_name(engine) == BASELINE and getattr(runtime, "device_memory", False):
                subject = Subject(model, module)
                bound = partial(open_engine, runtime, subject, feeds, details, io_binding=True)
                openers.append((IO_BINDING + spec_suffix(engine), ep, bound))
    return openers


@dataclass
class EngineCall(TimedCall):
    """An engine open for timing, and what the bench reads of it besides the times: the
    precision its results are judged in (its tolerance row), one run's outputs by name, and
    the weight bytes a forward pass over a number of tokens reads (its memory floor)."""

    precision: str = "float32"
    outputs: Callable[[], dict[str, np.ndarray]] = dict
    weight_bytes: Callable[[int], int] | None = None
    # A crash of its worker while timing, as one line naming its repro bundle
    crashed: Callable[[WorkerCrashed], str] = str


def open_engine(
    runtime: Runtime,
    subject: Subject,
    feeds: dict[str, np.ndarray],
    details: dict[str, object] | None = None,
    io_binding: bool = False,
    precision: str | None = None,
) -> EngineCall:
    """`subject` open on `runtime`, prepared for timing; closing the call closes the session.
    A runtime that cannot run here raises, with the reason the row reports; so does one that
    reads back another precision than `precision` (where given), before anything is opened;
    `details` join the row's."""
    if precision is not None and runtime.precision != precision:
        raise EngineUnavailable(
            f"not available: {runtime.name} computes {runtime.precision}, not {precision}, "
            "on this CPU (no native kernels for it); not timed"
        )
    stack = ExitStack()
    try:
        opened = stack.enter_context(open_subject(runtime, subject))
        call = opened.timed_call(feeds, io_binding)
    except NotRun as why:
        stack.close()
        if why.status == Status.CRASH:  # its worker died opening it: a crash, not a skip
            raise WorkerCrashed(str(why)) from None
        raise RuntimeError(str(why)) from None
    except BaseException:
        stack.close()
        raise
    if opened.onnx_file:
        call.details["model"] = str(subject.onnx.path)
    versions = getattr(runtime, "versions", None)  # a runtime in a worker: its exact packages
    if versions is not None:
        call.details["versions"] = versions()
    call.details.update(details or {})
    stack.callback(call.close)
    return EngineCall(
        call.run,
        stack.close,
        call.device_memory_mb,
        call.details,
        times=call.times,
        memory=call.memory,
        precision=opened.precision,
        outputs=lambda: dict(zip(opened.outputs, opened.run(feeds), strict=True)),
        weight_bytes=_weight_bytes(opened),
        crashed=lambda exc: crash_message(runtime, subject, opened.feeds(feeds), exc),
    )


def _weight_bytes(opened: Opened) -> Callable[[int], int] | None:
    """What counts the weight bytes the opened engine reads: its ONNX file's initializers, or
    its module's tensors (None where it holds neither)."""
    if opened.onnx_file:
        return partial(onnx_weight_bytes, opened.subject.onnx.path)
    module = getattr(opened.session, "module", None)
    return partial(module_weight_bytes, module) if module is not None else None


def _open_fused(
    runtime: Runtime, model: ModelUnderTest, cfg: ModelConfig, feeds: dict[str, np.ndarray]
) -> EngineCall:
    """ONNX Runtime on the plain export rewritten by the onnxruntime.transformers optimizer."""
    fused = fused_model(model.path, cfg)
    details = {"attention": "plain", "dtype": "float32", "fused_ops": fused_op_counts(fused)}
    return open_engine(runtime, Subject(derived_file(fused)), feeds, details)
