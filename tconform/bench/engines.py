"""The engines a bench run times: ONNX Runtime on one provider (on CUDA with and without IO
binding), PyTorch eager and torch.compile on the same device. Each engine is opened once, gives
back one call that runs a forward pass on fixed inputs, and is closed before the next opens, so
that its peak memory is its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tconform.config import ModelConfig
from tconform.errors import UsageError
from tconform.registry import Case
from tconform.runtimes import Subject, make_runtime, open_subject
from tconform.runtimes.onnxruntime import OrtRuntime

ENGINES = ("onnxruntime", "onnxruntime-fused", "torch", "torch-compile")
# onnxruntime-fused (the onnxruntime.transformers optimizer's graph) is an experiment: opt-in.
DEFAULT_ENGINES = ("onnxruntime", "torch", "torch-compile")


def parse_engines(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The requested engines in canonical order (the default engines when none is named)."""
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise UsageError(f"unknown engine {unknown[0]!r}; choose from {', '.join(ENGINES)}")
    return tuple(e for e in ENGINES if e in names) if names else DEFAULT_ENGINES


@dataclass
class OpenedEngine:
    """One engine ready to time: `run` does one forward pass, synchronised with the device."""

    run: Callable[[], object]
    close: Callable[[], None]
    device_memory_mb: Callable[[], float | None] = lambda: None
    details: dict[str, object] = field(default_factory=dict)


# --- ONNX Runtime -------------------------------------------------------------------------------


def open_ort(
    runtime: OrtRuntime, model_path: Path, feeds: dict[str, np.ndarray], io_binding: bool
) -> OpenedEngine:
    """An ONNX Runtime session on `runtime`'s provider (ProviderUnavailable if it would not
    really run there). Without IO binding each run copies inputs in and outputs back as numpy,
    as a plain session.run does; with it (CUDA only) both stay on the device."""
    ort_session = runtime.open(model_path)
    session = ort_session.session
    details: dict[str, object] = {"placement": ort_session.placement, "io_binding": io_binding}
    if not io_binding:

        def run() -> object:
            return session.run(None, feeds)

        return OpenedEngine(run, lambda: None, _cuda_used_mb_probe(runtime.ep), details)
    return _open_ort_bound(runtime, session, feeds, details)


def _open_ort_bound(
    runtime: OrtRuntime, session, feeds: dict[str, np.ndarray], details: dict[str, object]
) -> OpenedEngine:
    """CUDA with IO binding: inputs copied to the device once, outputs allocated there; each
    run waits for the device (synchronize_outputs) so the time covers the whole computation."""
    import onnxruntime as ort

    device = "cuda"
    binding = session.io_binding()
    device_inputs = {
        name: ort.OrtValue.ortvalue_from_numpy(array, device, runtime.device_id)
        for name, array in feeds.items()
    }
    for name, value in device_inputs.items():
        binding.bind_ortvalue_input(name, value)
    for output in session.get_outputs():
        binding.bind_output(output.name, device, runtime.device_id)
    binding.synchronize_inputs()

    def run() -> object:
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return None

    return OpenedEngine(run, binding.clear_binding_outputs, _cuda_used_mb_probe("cuda"), details)


def _cuda_used_mb_probe(ep: str) -> Callable[[], float | None]:
    """Device memory in use (total - free, whole device) for CUDA runs, read after the runs.
    ONNX Runtime's arena is outside torch's allocator, so this is the only shared measure."""
    if ep != "cuda" or not torch.cuda.is_available():
        return lambda: None

    def used_mb() -> float:
        free, total = torch.cuda.mem_get_info()
        return (total - free) / 2**20

    return used_mb


# --- PyTorch ------------------------------------------------------------------------------------


def open_torch(
    case: Case,
    cfg: ModelConfig,
    params: dict[str, np.ndarray],
    feeds: dict[str, np.ndarray],
    ep: str,
    compiled: bool,
) -> OpenedEngine:
    """The reference module on the torch runtime (eager, or torch.compile) on `ep`, inputs
    already on the device; every run ends synchronised with the device."""
    runtime = make_runtime("torch-compile" if compiled else "torch", ep)
    session = open_subject(runtime, Subject(module=case.module_target(cfg, params)))
    args = session.arguments(feeds)
    details: dict[str, object] = {"device": runtime.device}
    if compiled:
        session.call(args)  # the first call compiles; timed, so the report can show it
        details["compile_s"] = session.compile_seconds
    on_cuda = ep == "cuda"
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()

    def close() -> None:
        if compiled:
            torch._dynamo.reset()

    def device_memory_mb() -> float | None:
        return torch.cuda.max_memory_allocated() / 2**20 if on_cuda else None

    return OpenedEngine(lambda: session.call(args), close, device_memory_mb, details)
