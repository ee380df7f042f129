"""ONNX Runtime sessions on one execution provider, with the placement checked.

A session that ONNX Runtime silently moved to the CPU is refused (ProviderUnavailable, carrying
ONNX Runtime's logged reason, see tconform.runtimes.providers), so it can never be reported as
that provider's pass.

Every session records which provider each node of the optimised graph was assigned to
(ONNX Runtime >= 1.24: session config "session.record_ep_graph_assignment_info" = "1", read back
with `InferenceSession.get_provider_graph_assignment_info()`), so a CUDA result can say how many
nodes really ran on the GPU and which op types were left to the CPU.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto

from tconform.errors import ProviderUnavailable, TconformError, UsageError
from tconform.runtimes.providers import (
    CUDA_DEFAULT_OPTIONS,
    DEVICE_TYPES,
    GRAPH_OPT_LEVELS,
    PROVIDERS,
    RECORD_ASSIGNMENT,
    captured_stderr,
    reason_from_log,
    short_name,
    unavailable_reason,
)

# Copy nodes the CUDA provider inserts between host and device; they belong to the provider.
_COPY_OPS = {"MemcpyToHost", "MemcpyFromHost"}
# Session config: "1" flushes subnormal floats to zero (see OrtRuntime.match_calling_thread).
DENORMAL_AS_ZERO = "session.set_denormal_as_zero"


class KernelMissing(TconformError):
    """The provider has no kernel for an op at the model's element type (ORT NOT_IMPLEMENTED).

    Not a conformance failure: verify reports the case as `skip` with this message.
    """

    def __init__(self, provider: str, op_type: str, dtype: str) -> None:
        super().__init__(f"ONNX Runtime's {provider} provider has no {dtype} kernel for {op_type}")
        self.provider = provider
        self.op_type = op_type
        self.dtype = dtype


@dataclass
class OrtRuntime:
    """Creates sessions on one provider with recorded settings."""

    name: ClassVar[str] = "onnxruntime"
    consumes: ClassVar[str] = "onnx"
    eps: ClassVar[tuple[str, ...]] = tuple(PROVIDERS)

    ep: str = "cpu"
    graph_opt: str = "all"
    intra_op_threads: int = 0  # 0: ONNX Runtime's default (one per physical core)
    provider_options: dict[str, str] = field(default_factory=dict)  # raw, from the CLI
    tf32: bool = False  # CUDA only: allow TF32 matrix products
    device_id: int = 0  # CUDA only
    # Session config entries (SessionOptions.add_session_config_entry), e.g. bench's
    # "session.intra_op.allow_spinning"; recorded with the settings.
    session_config: dict[str, str] = field(default_factory=dict)
    # Names of ONNX Runtime's graph transformers not to run (InferenceSession's
    # disabled_optimizers), e.g. bench's "SkipLayerNormFusion"; recorded with the settings.
    disabled_optimizers: tuple[str, ...] = ()

    @property
    def provider(self) -> str:
        return PROVIDERS[self.ep]

    def final_provider_options(self) -> dict[str, str]:
        """The options handed to the provider: tconform's explicit defaults, then the raw
        options from the command line (which win)."""
        if self.ep != "cuda":
            return dict(self.provider_options)
        options = {
            "device_id": str(self.device_id),
            **CUDA_DEFAULT_OPTIONS,
            "use_tf32": "1" if self.tf32 else "0",
        }
        return {**options, **self.provider_options}

    @property
    def precision(self) -> str:
        """'tf32' when the CUDA provider may use TF32 matrix products, else 'float32'."""
        uses_tf32 = self.ep == "cuda" and self.final_provider_options().get("use_tf32") == "1"
        return "tf32" if uses_tf32 else "float32"

    def settings(self) -> dict[str, object]:
        """Everything that decides how a session runs, for the run manifest."""
        return {
            "ep": self.ep,
            "provider": self.provider,
            "provider_options": self.final_provider_options(),
            "precision": self.precision,
            "graph_optimization": self.graph_opt,
            "intra_op_threads": self.intra_op_threads,
            "session_config": dict(self.session_config),
            "disabled_optimizers": list(self.disabled_optimizers),
            "onnxruntime": ort.__version__,
        }

    def session_options(self) -> ort.SessionOptions:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = GRAPH_OPT_LEVELS[self.graph_opt]
        opts.intra_op_num_threads = self.intra_op_threads
        opts.log_severity_level = 3  # errors only; fallbacks are detected from get_providers()
        opts.add_session_config_entry(RECORD_ASSIGNMENT, "1")
        for key, value in self.session_config.items():
            opts.add_session_config_entry(key, value)
        return opts

    def open(self, model_path: Path) -> OrtSession:
        """A session on this runtime's provider, or ProviderUnavailable with ONNX Runtime's
        reason; KernelMissing when the provider lacks a kernel; UsageError for a bad file."""
        known_reason = unavailable_reason(self.ep)  # probed once: no failed load per model
        if known_reason is not None:
            raise ProviderUnavailable(f"{self.ep}: {known_reason}")
        providers: list = [(self.provider, self.final_provider_options())]
        if self.provider != "CPUExecutionProvider":
            providers.append("CPUExecutionProvider")
        with captured_stderr() as log:
            try:
                session = ort.InferenceSession(
                    str(model_path),
                    self.session_options(),
                    providers=providers,
                    disabled_optimizers=list(self.disabled_optimizers),
                )
            except Exception as exc:  # ORT raises its own exception types
                session, error = None, exc
        if session is None:
            raise self._load_error(model_path, error)
        actual = session.get_providers()
        if self.provider not in actual:
            reason = reason_from_log(log[0]) or unavailable_reason(self.ep) or "no reason logged"
            raise ProviderUnavailable(
                f"{self.ep}: {reason} (ONNX Runtime ran the session on {', '.join(actual)} only)"
            )
        self.match_calling_thread()
        placement, fallback_ops = assignment(session, self.provider)
        device = (DEVICE_TYPES.get(self.ep, "cpu"), self.device_id)
        return OrtSession(session, actual, placement, fallback_ops, device)

    def match_calling_thread(self) -> None:
        """Set this thread's subnormal flags as the session config asks, where it names them.

        ONNX Runtime sets its worker threads for every session, but the calling thread, which
        runs a share of every kernel, only for the first session of a process: without this a
        session's speed and bits would depend on which session came first."""
        if DENORMAL_AS_ZERO in self.session_config:
            import torch  # its set_flush_denormal sets the same two flags (FTZ and DAZ)

            torch.set_flush_denormal(self.session_config[DENORMAL_AS_ZERO] == "1")

    def _load_error(self, model_path: Path, exc: Exception) -> TconformError:
        text = str(exc).strip()
        missing = re.search(r"Could not find an implementation for (\w+)\(", text)
        if missing:
            return KernelMissing(self.ep.upper(), missing.group(1), model_dtype(model_path))
        first = text.splitlines()[0] if text else type(exc).__name__
        return UsageError(f"{model_path}: ONNX Runtime cannot load it: {first}")


def model_dtype(model_path: Path) -> str:
    """The element type of the model's first floating-point input or output ('float16', ...)."""
    names = {
        TensorProto.FLOAT: "float32",
        TensorProto.FLOAT16: "float16",
        TensorProto.BFLOAT16: "bfloat16",
        TensorProto.DOUBLE: "float64",
    }
    try:
        graph = onnx.load(str(model_path), load_external_data=False).graph
    except Exception:
        return "this element type's"
    for value in (*graph.input, *graph.output):
        elem_type = value.type.tensor_type.elem_type
        if elem_type in names:
            return names[elem_type]
    return "this element type's"


def assignment(
    session: ort.InferenceSession, requested: str
) -> tuple[dict[str, int], dict[str, int]]:
    """(placement, fallback_ops) from ONNX Runtime's record of the optimised graph.

    placement: {provider short name: node count}. fallback_ops: {op type: count} of nodes that
    ran on the CPU although another provider was requested (empty for CPU sessions).
    """
    placement: Counter[str] = Counter()
    fallback_ops: Counter[str] = Counter()
    for subgraph in session.get_provider_graph_assignment_info():
        nodes = subgraph.get_nodes()
        placement[short_name(subgraph.ep_name)] += len(nodes)
        if subgraph.ep_name == "CPUExecutionProvider" and requested != "CPUExecutionProvider":
            fallback_ops.update(n.op_type for n in nodes if n.op_type not in _COPY_OPS)
    return dict(placement), dict(fallback_ops)


def quiet_run() -> ort.RunOptions:
    """Run options that keep ONNX Runtime's own log of a failing kernel off stderr: the error
    comes back as the exception, which the result reports in one line."""
    options = ort.RunOptions()
    options.log_severity_level = 4  # fatal only
    return options


@dataclass
class OrtSession:
    session: ort.InferenceSession
    providers: list[str]  # get_providers(): what ONNX Runtime really registered
    placement: dict[str, int] = field(default_factory=dict)  # provider short name -> nodes
    fallback_ops: dict[str, int] = field(default_factory=dict)  # op type -> nodes left on CPU
    device: tuple[str, int] = ("cpu", 0)  # OrtValue device type and id of the provider

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, feeds, quiet_run())

    def run_bound(
        self, feeds: Mapping[str, np.ndarray | ort.OrtValue], keep: Collection[str]
    ) -> dict[str, np.ndarray | ort.OrtValue]:
        """One run with IO binding: OrtValue feeds are taken where they lie, the outputs named in
        `keep` stay on the provider's device as OrtValues (so a later run takes them without a
        host round trip), the others come back as NumPy arrays."""
        binding = self.session.io_binding()
        for name, value in feeds.items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        names = [output.name for output in self.session.get_outputs()]
        for name in names:
            binding.bind_output(name, *(self.device if name in keep else ("cpu", 0)))
        self.session.run_with_iobinding(binding, quiet_run())
        values = binding.get_outputs()
        return {
            name: value if name in keep else value.numpy()
            for name, value in zip(names, values, strict=True)
        }

    def to_device(self, array: np.ndarray) -> ort.OrtValue:
        """`array` copied to the provider's device, ready to be bound as an input."""
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), *self.device)
