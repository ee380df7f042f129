"""Runtimes: the one place that knows how to run a model. Every command (verify, the document
checks, check, generation, bench) goes through `make_runtime` and `open_subject`.

A runtime runs either an ONNX file (ONNX Runtime on an execution provider, ONNX's reference
evaluator) or a PyTorch module (eager, torch.compile). `open_subject` opens the part of a
`Subject` the runtime consumes and gives back a `Session`: `run(feeds) -> outputs`, plus what
really ran (`providers`) and, for ONNX Runtime, the node placement.

Adding a runtime is one module with a class following `Runtime` and one entry in RUNTIMES;
adding an execution provider is one entry in tconform.runtimes.providers.PROVIDERS.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from tconform.errors import UsageError
from tconform.runtimes.labels import runtime_label

# name -> "module:class", imported on first use so that the command line starts fast.
RUNTIMES: dict[str, str] = {
    "onnxruntime": "tconform.runtimes.onnxruntime:OrtRuntime",
    "onnx-reference": "tconform.runtimes.reference:ReferenceRuntime",
    "torch": "tconform.runtimes.torch:TorchRuntime",
    "torch-compile": "tconform.runtimes.torch:CompiledTorchRuntime",
}


class Session(Protocol):
    providers: list[str]  # what really ran, as the runtime reports it
    placement: dict[str, int]  # provider -> nodes (ONNX Runtime); empty elsewhere
    fallback_ops: dict[str, int]  # op type -> nodes left on the CPU (ONNX Runtime)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]: ...


class Runtime(Protocol):
    name: str  # its key in RUNTIMES
    ep: str  # the device or execution provider it runs on
    consumes: str  # "onnx" (opens a model file) or "module" (opens a ModuleTarget)

    @property
    def precision(self) -> str: ...

    def settings(self) -> dict[str, object]: ...

    def open(self, target) -> Session: ...


@dataclass(frozen=True)
class ModuleTarget:
    """A PyTorch module to run: `build()` makes it (float32, weights loaded, eval mode);
    `inputs` names its positional inputs in order, and says which are floats (cast to the
    runtime's dtype) by their TensorSpec kind."""

    build: Callable[[], object]
    inputs: tuple  # TensorSpec, in forward's order


@dataclass(frozen=True)
class Subject:
    """One thing under test, as each kind of runtime consumes it."""

    onnx: Path | None = None
    module: ModuleTarget | None = None


def runtime_class(name: str) -> type:
    if name not in RUNTIMES:
        raise UsageError(f"unknown runtime {name!r}; choose from {', '.join(RUNTIMES)}")
    module, cls = RUNTIMES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_runtime(name: str, ep: str = "cpu", **options) -> Runtime:
    """The runtime `name` on `ep`, with runtime-specific options (tf32, graph_opt, ...)."""
    return runtime_class(name)(ep=ep, **options)


def open_subject(runtime: Runtime, subject: Subject) -> Session:
    """Open the part of `subject` that `runtime` consumes."""
    target = subject.onnx if runtime.consumes == "onnx" else subject.module
    if target is None:
        needs = "an ONNX model" if runtime.consumes == "onnx" else "a PyTorch module"
        raise UsageError(f"{label(runtime)} needs {needs}, and this check has none")
    return runtime.open(target)


def label(runtime: Runtime) -> str:
    return runtime_label(runtime.name, runtime.ep, runtime.precision)
