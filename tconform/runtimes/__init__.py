"""Runtimes: the one place that knows how to run a model (tconform.runtimes.base has the
interface). Every command builds its runtimes here, from one `RuntimeOptions`, and runs them
through tconform.execution.

Adding a runtime is one module with a `Runtime` class and its `Session`, and one entry in
RUNTIMES (docs/design.md, "Add a runtime": OpenVINO is the worked example); adding an ONNX
Runtime execution provider is one entry in tconform.runtimes.providers.PROVIDERS.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tconform.errors import UsageError
from tconform.runtimes.base import (
    ModuleTarget,
    Runtime,
    RuntimeOption,
    Session,
    TensorInfo,
    TimedCall,
)
from tconform.runtimes.labels import runtime_label
from tconform.runtimes.specs import RuntimeSpec, base_name, parse_spec

MAX_THREADS = 1024  # intra-op threads a session may be given (--threads, `threads=`)

__all__ = [
    "RUNTIMES",
    "ModuleTarget",
    "Runtime",
    "RuntimeOption",
    "RuntimeOptions",
    "RuntimeSpec",
    "Session",
    "TensorInfo",
    "TimedCall",
    "declared_options",
    "declared_settings",
    "label",
    "make_runtime",
    "make_runtimes",
    "runtime_class",
    "takes_option",
]

# name -> "module:class", imported on first use so that the command line starts fast.
RUNTIMES: dict[str, str] = {
    "onnxruntime": "tconform.runtimes.onnxruntime:OrtRuntime",
    "openvino": "tconform.runtimes.openvino:OpenVinoRuntime",
    "onnx-reference": "tconform.runtimes.onnx_reference:OnnxReferenceRuntime",
    "torch": "tconform.runtimes.torch:TorchRuntime",
    "torch-compile": "tconform.runtimes.torch:CompiledTorchRuntime",
    "torch-int8": "tconform.runtimes.torch:QuantizedTorchRuntime",
    "torch-compile-int8": "tconform.runtimes.torch:CompiledQuantizedTorchRuntime",
    "torch-bf16": "tconform.runtimes.torch:BFloat16TorchRuntime",
    "torch-compile-bf16": "tconform.runtimes.torch:CompiledBFloat16TorchRuntime",
}


@dataclass(frozen=True)
class RuntimeOptions:
    """What a command asks of its runtimes, from the shared command-line options: which
    runtimes (names, or specs naming a release or an interpreter: tconform.runtimes.specs), on
    which providers, their threads, and the options runtimes declare (Runtime.options), by
    field, each given to the runtimes that take it: ONNX Runtime's tf32 or graph_opt,
    OpenVINO's bf16. An option not in `settings` keeps its runtime's default."""

    names: tuple[str, ...] = ("onnxruntime", "torch")
    eps: tuple[str, ...] = ("cpu",)
    settings: Mapping[str, object] = field(default_factory=dict)
    threads: int = 0  # 0: the runtime's default
    # Where a runtime in a worker writes the repro bundle of a crash (None: nowhere; the
    # command's choice, beside its reports: tconform.runtimes.crashes)
    crash_folder: Path | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.threads, int) and 0 <= self.threads <= MAX_THREADS):
            raise UsageError(f"threads {self.threads!r}: must be 0 (the default) .. {MAX_THREADS}")

    def replace(self, **changes: object) -> RuntimeOptions:
        return dataclasses.replace(self, **changes)

    def flags(self) -> list[str]:
        """The options given, as the command line gives them (`--threads 1`, `--no-spinning`,
        `--provider-option KEY=VALUE`): what a report says the runtimes ran with beside their
        defaults."""
        declared = declared_options()
        given = [f"--threads {self.threads}"] if self.threads else []
        for name, value in self.settings.items():
            flag = declared[name].flag
            if isinstance(value, bool):
                given.append(flag if value else f"--no-{flag.removeprefix('--')}")
            elif isinstance(value, Mapping):
                given += [f"{flag} {key}={item}" for key, item in value.items()]
            else:
                given.append(f"{flag} {value}")
        return given

    def given(self, **settings: object) -> RuntimeOptions:
        """These options with `settings` set too (a plan's graph-optimisation level)."""
        return self.replace(settings={**self.settings, **settings})


def runtime_class(name: str) -> type:
    """The class of a runtime, by its name or a spec's text ('onnxruntime==1.20.1')."""
    name = base_name(name)
    if name not in RUNTIMES:
        raise UsageError(f"unknown runtime {name!r}; choose from {', '.join(RUNTIMES)}")
    module, cls = RUNTIMES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def declared_options() -> dict[str, RuntimeOption]:
    """Every option the runtimes declare, by field (the command line's runtime group). It
    imports every runtime's module; each imports its library (torch, OpenVINO) only to open a
    session, so reading this costs no library import."""
    declared: dict[str, RuntimeOption] = {}
    for name in RUNTIMES:
        for option in runtime_class(name).options:
            declared.setdefault(option.field, option)
    return declared


def declared_settings(settings: Mapping[str, object]) -> dict[str, object]:
    """`settings` (the Python API's runtime options), or one UsageError line naming one that
    no runtime declares."""
    declared = declared_options()
    for name, value in settings.items():
        if name not in declared:
            raise UsageError(
                f"runtime option {name!r}: no runtime takes it (they take "
                f"{', '.join(sorted(declared))})"
            )
        problem = declared[name].problem(value)
        if problem:
            raise UsageError(f"runtime option {name!r}: {problem}")
    return dict(settings)


def require_taken(
    names: Sequence[str],
    settings: Mapping[str, object],
    threads: int = 0,
    eps: Sequence[str] = (),
) -> None:
    """Every option given (and --threads, where given) is taken by one of the runtimes `names`
    at least (names or specs), and acts on one of the providers `eps` (where given), or one
    UsageError line naming it and who takes it: an option that would change nothing, yet
    reports say it was given, is refused, never passed over (`--tf32` on the CPU alone)."""
    given = [*settings, *(["threads"] if threads else [])]
    declared = declared_options()
    for option in given:
        flag = "--threads" if option == "threads" else declared[option].flag
        if not any(option in _fields(name) for name in names):
            takers = [n for n in RUNTIMES if option in _fields(n)]
            raise UsageError(
                f"{flag}: none of the runtimes chosen ({', '.join(names)}) takes it; "
                f"{', '.join(takers)} {'does' if len(takers) == 1 else 'do'}"
            )
        acts_on = declared[option].eps if option in declared else ()
        if eps and acts_on and not set(acts_on) & set(eps):
            raise UsageError(
                f"{flag}: acts on {', '.join(acts_on)} only, and the run's providers are "
                f"{', '.join(eps)} (add --ep {acts_on[0]}, or leave it out)"
            )


def _fields(name: str) -> set[str]:
    return {f.name for f in dataclasses.fields(runtime_class(name))}


def takes_option(runtime: Runtime, option: str) -> bool:
    """Whether `runtime` (in tconform's process or in a worker) takes `option`, a field of its
    runtime class (ONNX Runtime's graph_opt, OpenVINO's bf16)."""
    return option in _fields(runtime.name)


def spec_of(text: str) -> RuntimeSpec:
    """A runtime spec's text parsed, or one UsageError line saying what is wrong."""
    try:
        return parse_spec(text)
    except ValueError as exc:
        raise UsageError(f"runtime spec {exc}") from None


def can_isolate(name: str) -> bool:
    """Whether the runtime `name` (a name or a spec's text), now in tconform's process, could
    run in a worker process of its own (`NAME@python`: the same installed release), where its
    crash is its own verdict rather than the end of the command: a runtime that opens ONNX
    files; one that runs a PyTorch module in tconform's process cannot."""
    spec = spec_of(name)
    cls = runtime_class(spec.name)
    return not spec.in_worker and cls.consumes == "onnx" and bool(getattr(cls, "package", None))


def make_runtime(name: str, ep: str = "cpu", **options: object) -> Runtime:
    """The runtime `name` (a name, or a spec's text) on `ep`, given the options among `options`
    that it takes. A spec naming a release or an interpreter runs in a worker process
    (tconform.runtimes.remote)."""
    spec = spec_of(name)
    cls = runtime_class(spec.name)
    if spec.in_worker:
        from tconform.runtimes.remote import remote_runtime

        return remote_runtime(spec, cls, ep, options)
    accepted = {f.name for f in dataclasses.fields(cls)}
    return cls(ep=ep, **{k: v for k, v in options.items() if k in accepted})


def make_runtimes(options: RuntimeOptions, consumes: str | None = None) -> list[Runtime]:
    """Every runtime of `options.names` on every provider of `options.eps` it runs on (only
    those that consume `consumes`, "onnx" or "module", when given), in the order named."""
    shared = {**options.settings, "threads": options.threads, "crash_folder": options.crash_folder}
    runtimes = []
    for name in options.names:
        cls = runtime_class(name)
        if consumes is not None and cls.consumes != consumes:
            continue
        runtimes += [make_runtime(name, ep, **shared) for ep in options.eps if ep in cls.eps]
    return runtimes


def label(runtime: Runtime) -> str:
    return runtime_label(runtime.name, runtime.ep, runtime.precision)
