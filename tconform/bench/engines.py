"""The engines a bench run times: every runtime of tconform.runtimes.RUNTIMES that is a
deployment target, opened through the execution layer. Graph variants (GRAPH_VARIANTS) are the
engines that run one export on one runtime: ONNX Runtime on the plain, sdpa, optimizer-fused,
float16, bfloat16, int8 and int4 graphs (on CUDA the plain one also with IO binding), OpenVINO
on the plain graph at its bfloat16 inference precision; the other ONNX runtimes (OpenVINO at
float32) run the plain export; the module runtimes (PyTorch eager, torch.compile, torch's
dynamic int8, bfloat16 autocast) the workload's module: tconform's reference module, or a
user's own, as the user holds it. A user's model has the variants of its dtype cells only.
Each engine is opened once, gives back one call that runs a forward pass on fixed
inputs, and is closed before the next opens, so that its peak memory is its own."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial

import numpy as np

from tconform.bench.fusions import fused_model, fused_op_counts
from tconform.bench.weights import HELD_FLOAT_BYTES, module_weight_bytes, onnx_weight_bytes
from tconform.bench.workload import Workload
from tconform.config import ModelConfig
from tconform.errors import UsageError, WorkerCrashed
from tconform.execution import NotRun, Opened, Subject, crash_message, open_subject
from tconform.models import ModelUnderTest, derived_file
from tconform.module_check.convert import DTYPES
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
    # the float16 and bfloat16 models: tconform's cases exported in that dtype (tconform
    # export --dtype); a user's model converted by onnxruntime.transformers.float16
    # (keep_io_types), or exported in bfloat16 (tconform.module_check.convert)
    "onnxruntime-fp16": GraphVariant(dtype="float16"),
    "onnxruntime-bf16": GraphVariant(dtype="bfloat16"),
    # the sdpa export in float16: one ONNX Attention node per attention, where a GPU provider
    # has fused kernels for it (the float16 plain graph spends half its GPU time in Softmax)
    "onnxruntime-sdpa-fp16": GraphVariant(attention="sdpa", dtype="float16"),
    # onnxruntime.quantization.quantize_dynamic of the float32 export (tconform export --dtype
    # int8, a user's model's int8 cell): int8 weights, activations quantised per call
    "onnxruntime-int8": GraphVariant(dtype="int8"),
    # the same quantisation of the sdpa export: the projections int8, the fused Attention
    # float32 (ONNX Runtime's contrib QAttention is another op: export/quantize.py)
    "onnxruntime-sdpa-int8": GraphVariant(attention="sdpa", dtype="int8"),
    # onnxruntime.quantization's MatMulNBitsQuantizer of the float32 export (tconform export
    # --dtype int4): 4-bit weights in blocks of 32, what ONNX Runtime GenAI ships for the CPU
    "onnxruntime-int4": GraphVariant(dtype="int4"),
    # OpenVINO's bf16 inference precision on the float32 export: where the CPU has no bf16
    # kernels (AVX512-BF16, AMX) OpenVINO compiles float32 instead, and the row says so
    "openvino-bf16": GraphVariant("openvino", options=(("bf16", True),), precision="bfloat16"),
}
BASELINE = "onnxruntime"
# An ONNX Runtime graph variant's row with its inputs and outputs bound on the device
# (onnxruntime-iobinding, onnxruntime-fp16-iobinding), beside its row with numpy in and out,
# where the provider has device memory: what a GPU deployment keeps from copying
IO_BINDING = "-iobinding"


class NotOpened(RuntimeError):
    """The engine could not open its model: a row of `status` that says why (skip for a
    runtime release too old for it, error for a runtime that rejects a well-formed model),
    with `details` naming the model's bytes and, for a runtime in a worker, the exact versions
    that said so."""

    def __init__(self, why: str, details: dict[str, object], status: Status) -> None:
        super().__init__(why)
        self.details = details
        self.status = status


class EngineUnavailable(RuntimeError):
    """The engine cannot run as itself here (a reduced precision the CPU lacks): the row
    says why and nothing is timed."""


def timed_runtimes() -> tuple[str, ...]:
    """The runtimes other than ONNX Runtime (whose variants stand for it) that a bench times:
    all but those that are not deployment targets (onnx.reference)."""
    return tuple(name for name in RUNTIMES if name != BASELINE and runtime_class(name).timed)


def engine_names(for_module: bool = False) -> tuple[str, ...]:
    """Every engine, in canonical order; `for_module`: those that time a user's model."""
    if not for_module:
        return (*GRAPH_VARIANTS, *timed_runtimes())
    return (*(e for e, v in GRAPH_VARIANTS.items() if _of_a_module(v)), *timed_runtimes())


def _of_a_module(variant: GraphVariant) -> bool:
    """Whether a user's model has the variant's graph: its dtype cells (the float32 export,
    its float16 and int8 conversions, the bfloat16 export) do; tconform's sdpa export, the
    optimizer's fusions (they need the model's shape: heads, width) and int4 are its own."""
    return variant.attention == "plain" and not variant.optimizer and variant.dtype in DTYPES


# onnxruntime-fused is opt-in: ONNX Runtime's own session-time fusions already do what the
# optimizer adds on these graphs (docs/performance.md); OpenVINO is opt-in (an optional
# package); the reduced-precision engines are opt-in: they compute in another precision
# (their own tolerance row), and each is one more export of every case.
DEFAULT_ENGINES = ("onnxruntime", "onnxruntime-sdpa", "torch", "torch-compile")
# A user's model: its float32, float16 and int8 models against torch eager, torch.compile and
# torch's dynamic int8 (bfloat16 is opt-in: ONNX Runtime's CPU provider has few bfloat16
# kernels, and torch-bf16 needs a CPU with native bfloat16 to be worth timing).
MODULE_ENGINES = (
    "onnxruntime", "onnxruntime-fp16", "onnxruntime-int8", "torch", "torch-compile", "torch-int8",
)  # fmt: skip


def parse_engines(names: tuple[str, ...] | list[str], for_module: bool = False) -> tuple[str, ...]:
    """The requested engines in canonical order (the default engines when none is named);
    `for_module`: of a user's model, which lacks tconform's own graph variants. An engine may
    name a release or an interpreter of its runtime as a runtime spec does
    (onnxruntime==1.20.1, onnxruntime-sdpa==1.20.1, openvino@/opt/py/bin/python): it runs in a
    worker (tconform.runtimes.remote), after the engine it is a version of."""
    known = engine_names(for_module)
    given = []
    for name in names:
        try:
            given.append(parse_spec(name))
        except ValueError as exc:
            raise UsageError(f"engine {exc}") from None
    unknown = [spec.name for spec in given if spec.name not in known]
    if unknown and for_module and unknown[0] in engine_names():
        raise UsageError(
            f"engine {unknown[0]!r} times a graph only tconform's own cases have; a user's "
            f"model's engines: {', '.join(known)}"
        )
    if unknown:
        raise UsageError(f"unknown engine {unknown[0]!r}; choose from {', '.join(known)}")
    if not names:
        return MODULE_ENGINES if for_module else DEFAULT_ENGINES
    texts = dict.fromkeys(spec.text for spec in given)
    return tuple(e for base in known for e in texts if base_name(e) == base)


def engine_variant(engine: str) -> GraphVariant | None:
    """The graph variant an engine (or a release of it) times, None for a runtime's own engine;
    the variant's own for its IO-binding row."""
    return GRAPH_VARIANTS.get(base_name(engine).removesuffix(IO_BINDING))


def io_bound(engine: str) -> bool:
    """Whether the engine's row binds its inputs and outputs on the device."""
    return base_name(engine).endswith(IO_BINDING)


def engine_runtime(engine: str) -> str:
    """The runtime (a name or spec) an engine runs on: its graph variant's, else its own
    (onnxruntime-sdpa==1.20.1 -> onnxruntime==1.20.1)."""
    variant = engine_variant(engine)
    return (variant.runtime if variant else base_name(engine)) + spec_suffix(engine)


def ran_on(runtime: Runtime, subject: Subject) -> dict[str, object]:
    """What a row names of what it ran, opened or not: the model's exact bytes (path, sha256,
    origin) where the runtime runs a file, and a runtime in a worker's exact packages."""
    found: dict[str, object] = {}
    if runtime.consumes == "onnx" and subject.onnx is not None:
        provenance = subject.onnx.provenance
        found.update(
            model=str(subject.onnx.path), sha256=provenance.sha256, origin=provenance.origin
        )
    versions = runtime.versions()
    if versions is not None:
        found["versions"] = versions
    return found


Opener = Callable[[], TimedCall]
# (runtime name, ep, options) -> that runtime as the bench configures it (threads, session
# settings, and the options a variant adds)
RuntimeFor = Callable[..., Runtime]


def expected_precision(engine: str, ep: str, runtime_for: RuntimeFor) -> str:
    """The precision `engine` is meant to compute in on `ep` (whose ceiling it is measured
    against): a graph variant's quantised dtype or the precision it asks its runtime for,
    else what its runtime computes in (torch-int8: int8, torch-bf16: bfloat16). What it really
    ran in is read back when it opens."""
    variant = engine_variant(engine)
    if variant is not None and variant.dtype != "float32":
        return variant.dtype
    precision = variant.precision if variant is not None else None
    return precision or runtime_for(engine_runtime(engine), ep).precision


def engine_rows(
    engines: tuple[str, ...],
    eps: tuple[str, ...],
    runtime_for: RuntimeFor,
    module_ep: str | None = None,
) -> list[tuple[str, str]]:
    """(engine, provider) of every row, in report order: each of `engines` on each of `eps`
    its runtime runs on (a module runtime only on `module_ep`, where given: a user's module
    runs where the user put it), each ONNX Runtime graph variant's IO-binding row after it on a
    provider with device memory (each release of it with its own)."""
    rows = []
    for ep in eps:
        for engine in engines:
            runtime = engine_runtime(engine)
            if ep not in runtime_class(runtime).eps:
                continue
            if _runs_module(runtime) and module_ep not in (None, ep):
                continue
            rows.append((engine, ep))
            variant = engine_variant(engine)
            bindable = variant is not None and variant.runtime == BASELINE and not variant.optimizer
            if bindable and runtime_for(runtime, ep).device_memory:
                rows.append((base_name(engine) + IO_BINDING + spec_suffix(engine), ep))
    return rows


def _runs_module(runtime: str) -> bool:
    return runtime_class(runtime).consumes == "module"


def engine_openers(
    engines: tuple[str, ...],
    eps: tuple[str, ...],
    workload: Workload,
    runtime_for: RuntimeFor,
) -> list[tuple[str, str, Opener]]:
    """(engine, provider, opener) for each row of `engine_rows` on `workload`: a graph
    variant on the workload's model of its export, a module runtime on its module."""
    openers: list[tuple[str, str, Opener]] = []
    for engine, ep in engine_rows(engines, eps, runtime_for, workload.module_ep):
        variant = engine_variant(engine)
        name = engine_runtime(engine)
        if variant is not None:
            options = dict(variant.options)
        else:  # a module runtime takes the module's own dtype and device
            options = dict(workload.module_options) if _runs_module(name) else {}
        runtime = runtime_for(name, ep, **options)
        model = workload.models.get(variant.export if variant else PLAIN_EXPORT)
        subject = Subject(model, workload.module)
        details = {"attention": variant.attention, "dtype": variant.dtype} if variant else {}
        if variant is not None and variant.optimizer:
            opener = partial(_open_fused, runtime, model, workload.cfg, workload.feeds)
        else:
            opener = partial(
                open_engine, runtime, subject, workload.feeds, details,
                io_binding=io_bound(engine),
                precision=variant.precision if variant else None,
            )  # fmt: skip
        openers.append((engine, ep, opener))
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
    reads back another precision than `precision` (where given), before anything is opened,
    and one whose model fixes a dimension the feeds have otherwise; `details` join the row's."""
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
            crashed = WorkerCrashed(str(why))
            crashed.details = ran_on(runtime, subject)
            raise crashed from None
        raise NotOpened(str(why), ran_on(runtime, subject), why.status) from None
    except BaseException:
        stack.close()
        raise
    call.details.update({**ran_on(runtime, subject), **(details or {})})
    stack.callback(call.close)
    return EngineCall(
        call.run,
        stack.close,
        call.device_memory_mb,
        call.details,
        times=call.times,
        memory=call.memory,
        precision=opened.precision,
        outputs=lambda: opened.run(feeds),
        weight_bytes=weight_counter(opened),
        crashed=lambda exc: crash_message(runtime, subject, opened.feeds(feeds), exc),
    )


def weight_counter(opened: Opened) -> Callable[[int], int] | None:
    """What counts the weight bytes the opened engine reads: its ONNX file's initializers (the
    float32 ones in the narrower float type its runtime computes in, where it converts them:
    OpenVINO at bf16), or its module's tensors (None where it holds neither)."""
    if opened.onnx_file:
        float_itemsize = HELD_FLOAT_BYTES.get(opened.session.precision, 4)
        return partial(onnx_weight_bytes, opened.subject.onnx.path, float_itemsize=float_itemsize)
    module = getattr(opened.session, "module", None)
    return partial(module_weight_bytes, module) if module is not None else None


def _open_fused(
    runtime: Runtime, model: ModelUnderTest, cfg: ModelConfig, feeds: dict[str, np.ndarray]
) -> EngineCall:
    """ONNX Runtime on the plain export rewritten by the onnxruntime.transformers optimizer."""
    fused = fused_model(model.path, cfg)
    details = {"attention": "plain", "dtype": "float32", "fused_ops": fused_op_counts(fused)}
    return open_engine(runtime, Subject(derived_file(fused)), feeds, details)
