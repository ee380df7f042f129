"""The engines a bench run times: every runtime of tconform.runtimes.RUNTIMES that is a
deployment target, opened through the execution layer. ONNX Runtime is timed once per graph
variant (and on CUDA also with IO binding); the other ONNX runtimes (OpenVINO) on the plain
export; the module runtimes (PyTorch eager, torch.compile) on the reference module. Each engine
is opened once, gives back one call that runs a forward pass on fixed inputs, and is closed
before the next opens, so that its peak memory is its own."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial

import numpy as np

from tconform.bench.fusions import fused_model, fused_op_counts
from tconform.config import ModelConfig
from tconform.errors import UsageError
from tconform.execution import NotRun, Subject, case_module, open_subject
from tconform.models import ModelUnderTest, derived_file
from tconform.registry import Case
from tconform.runtimes import RUNTIMES, Runtime, TimedCall, runtime_class


@dataclass(frozen=True)
class OrtVariant:
    """One graph ONNX Runtime is timed on: the export's attention kernel, and whether the
    onnxruntime.transformers optimizer rewrote it (bench/fusions.py)."""

    attention: str
    optimizer: bool = False


# The plain export is the baseline every variant's gain is measured against.
ORT_VARIANTS = {
    "onnxruntime": OrtVariant("plain"),
    "onnxruntime-sdpa": OrtVariant("sdpa"),
    "onnxruntime-fused": OrtVariant("plain", optimizer=True),
}
BASELINE = "onnxruntime"
IO_BINDING = "onnxruntime-iobinding"  # the baseline with IO binding, where a device has memory


def timed_runtimes() -> tuple[str, ...]:
    """The runtimes other than ONNX Runtime (whose variants stand for it) that a bench times:
    all but those that are not deployment targets (onnx.reference)."""
    return tuple(
        name
        for name in RUNTIMES
        if name != BASELINE and getattr(runtime_class(name), "timed", True)
    )


def engine_names() -> tuple[str, ...]:
    return (*ORT_VARIANTS, *timed_runtimes())


# onnxruntime-fused is opt-in: ONNX Runtime's own session-time fusions already do what the
# optimizer adds on these graphs (docs/performance.md); OpenVINO is opt-in (an optional
# package).
DEFAULT_ENGINES = ("onnxruntime", "onnxruntime-sdpa", "torch", "torch-compile")


def parse_engines(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The requested engines in canonical order (the default engines when none is named)."""
    known = engine_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown engine {unknown[0]!r}; choose from {', '.join(known)}")
    return tuple(e for e in known if e in names) if names else DEFAULT_ENGINES


Opener = Callable[[], TimedCall]
# (runtime name, ep) -> that runtime as the bench configures it (threads, session settings)
RuntimeFor = Callable[[str, str], Runtime]


def engine_openers(
    engines: tuple[str, ...],
    eps: tuple[str, ...],
    case: Case,
    cfg: ModelConfig,
    params: dict[str, np.ndarray],
    feeds: dict[str, np.ndarray],
    models: dict[str, ModelUnderTest],
    runtime_for: RuntimeFor,
) -> list[tuple[str, str, Opener]]:
    """(engine, provider, opener) for each of `engines` on each of `eps`, in report order.
    `models` maps an attention kernel to `case`'s model exported with it."""
    openers: list[tuple[str, str, Opener]] = []
    module = case_module(case, cfg, params)
    for ep in eps:
        for engine in engines:
            variant = ORT_VARIANTS.get(engine)
            name = BASELINE if variant else engine
            if ep not in runtime_class(name).eps:
                continue
            runtime = runtime_for(name, ep)
            model = models.get(variant.attention if variant else "plain")
            details = {"attention": variant.attention} if variant else {}
            if variant is not None and variant.optimizer:
                opener = partial(_open_fused, runtime, model, cfg, feeds)
            else:
                opener = partial(open_engine, runtime, Subject(model, module), feeds, details)
            openers.append((engine, ep, opener))
            if engine == BASELINE and getattr(runtime, "device_memory", False):
                subject = Subject(model, module)
                bound = partial(open_engine, runtime, subject, feeds, details, io_binding=True)
                openers.append((IO_BINDING, ep, bound))
    return openers


def open_engine(
    runtime: Runtime,
    subject: Subject,
    feeds: dict[str, np.ndarray],
    details: dict[str, object] | None = None,
    io_binding: bool = False,
) -> TimedCall:
    """`subject` open on `runtime`, prepared for timing; closing the call closes the session.
    A runtime that cannot run here raises, with the reason the row reports; `details` join the
    row's."""
    stack = ExitStack()
    try:
        opened = stack.enter_context(open_subject(runtime, subject))
        call = opened.timed_call(feeds, io_binding)
    except NotRun as why:
        stack.close()
        raise RuntimeError(str(why)) from None
    except BaseException:
        stack.close()
        raise
    if opened.onnx_file:
        call.details["model"] = str(subject.onnx.path)
    call.details.update(details or {})
    stack.callback(call.close)
    return TimedCall(call.run, stack.close, call.device_memory_mb, call.details)


def _open_fused(
    runtime: Runtime, model: ModelUnderTest, cfg: ModelConfig, feeds: dict[str, np.ndarray]
) -> TimedCall:
    """ONNX Runtime on the plain export rewritten by the onnxruntime.transformers optimizer."""
    fused = fused_model(model.path, cfg)
    details = {"attention": "plain", "fused_ops": fused_op_counts(fused)}
    return open_engine(runtime, Subject(derived_file(fused)), feeds, details)
