"""The engines a bench run times: ONNX Runtime on one provider, once per graph variant (on CUDA
also with IO binding), PyTorch eager and torch.compile on the same device. Each engine is opened
once, gives back one call that runs a forward pass on fixed inputs, and is closed before the
next opens, so that its peak memory is its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch

from tconform.bench.fusions import fused_model, fused_op_counts
from tconform.config import ModelConfig
from tconform.errors import UsageError
from tconform.registry import Case
from tconform.runtimes import Subject, make_runtime, open_subject
from tconform.runtimes.onnxruntime import OrtRuntime
from tconform.runtimes.torch import TorchRuntime


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
ENGINES = (*ORT_VARIANTS, "torch", "torch-compile")
# onnxruntime-fused is opt-in: ONNX Runtime's own session-time fusions already do what the
# optimizer adds on these graphs (docs/performance.md).
DEFAULT_ENGINES = ("onnxruntime", "onnxruntime-sdpa", "torch", "torch-compile")


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


Opener = Callable[[], OpenedEngine]


def engine_openers(
    engines: tuple[str, ...],
    eps: tuple[str, ...],
    case: Case,
    cfg: ModelConfig,
    params: dict[str, np.ndarray],
    feeds: dict[str, np.ndarray],
    models: dict[str, Path],
    ort_runtime: Callable[[str], OrtRuntime],
) -> list[tuple[str, str, Opener]]:
    """(engine, provider, opener) for each of `engines` on each of `eps`, in report order.
    `models` maps an attention kernel to `case`'s model exported with it; `ort_runtime(ep)` is
    the ONNX Runtime the run times on `ep`."""
    openers: list[tuple[str, str, Opener]] = []
    for ep in eps:
        runtime = ort_runtime(ep)
        for engine, variant in ORT_VARIANTS.items():
            if engine in engines:
                model = models[variant.attention]
                openers.append(
                    (engine, ep, partial(_open_variant, runtime, model, variant, cfg, feeds))
                )
        if ep == "cuda" and BASELINE in engines:
            openers.append(
                (
                    "onnxruntime-iobinding",
                    ep,
                    partial(open_ort, runtime, models["plain"], feeds, True),
                )
            )
    # torch on every provider it has a device for (CUDA only where torch sees one).
    for device in (ep for ep in eps if ep in TorchRuntime.eps):
        for engine, compiled in (("torch", False), ("torch-compile", True)):
            if engine in engines:
                openers.append(
                    (
                        engine,
                        device,
                        partial(open_torch, case, cfg, params, feeds, device, compiled),
                    )
                )
    return openers


# --- ONNX Runtime -------------------------------------------------------------------------------


def _open_variant(
    runtime: OrtRuntime,
    model: Path,
    variant: OrtVariant,
    cfg: ModelConfig,
    feeds: dict[str, np.ndarray],
) -> OpenedEngine:
    """An ONNX Runtime session on `variant`'s graph of `model`."""
    if not variant.optimizer:
        opened = open_ort(runtime, model, feeds, False)
        opened.details.update(attention=variant.attention, model=str(model))
        return opened
    fused = fused_model(model, cfg)
    opened = open_ort(runtime, fused, feeds, False)
    opened.details.update(
        attention=variant.attention, model=str(fused), fused_ops=fused_op_counts(fused)
    )
    return opened


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
    # PyTorch's default, subnormals kept, whatever an ONNX Runtime engine set on this thread.
    torch.set_flush_denormal(False)
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
