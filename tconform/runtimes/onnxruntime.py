"""ONNX Runtime sessions on one execution provider, with the placement checked.

ONNX Runtime's GPU build falls back to the CPU silently when a provider cannot load: the session
is created, `get_providers()` simply lacks the requested provider, and the only trace of the
reason is a line that ONNX Runtime's C++ logger writes to stderr. Here such a session is refused
(ProviderUnavailable, carrying that line), so it can never be reported as that provider's pass.

Every session records which provider each node of the optimised graph was assigned to
(ONNX Runtime >= 1.24: session config "session.record_ep_graph_assignment_info" = "1", read back
with `InferenceSession.get_provider_graph_assignment_info()`), so a CUDA result can say how many
nodes really ran on the GPU and which op types were left to the CPU.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from tconform.errors import ProviderUnavailable, TconformError, UsageError

# tconform's short names for the providers it supports.
PROVIDERS: dict[str, str] = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
}

GRAPH_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}

# The session config entry that makes ONNX Runtime keep the node -> provider assignment.
RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"

# CUDA provider options tconform always sets, so the manifest records them explicitly.
# use_tf32 "0": strict float32 matrix products (the CUDA provider's own default is TF32).
# cudnn_conv_algo_search: ONNX Runtime's default, written down so that a run states it.
CUDA_DEFAULT_OPTIONS: dict[str, str] = {"use_tf32": "0", "cudnn_conv_algo_search": "EXHAUSTIVE"}

# Copy nodes the CUDA provider inserts between host and device; they belong to the provider.
_COPY_OPS = {"MemcpyToHost", "MemcpyFromHost"}


class KernelMissing(TconformError):
    """The provider has no kernel for an op at the model's element type (ORT NOT_IMPLEMENTED).

    Not a conformance failure: verify reports the case as `skip` with this message.
    """

    def __init__(self, provider: str, op_type: str, dtype: str) -> None:
        super().__init__(f"ONNX Runtime's {provider} provider has no {dtype} kernel for {op_type}")
        self.provider = provider
        self.op_type = op_type
        self.dtype = dtype


def available_eps() -> list[str]:
    """Short names of the supported providers this ONNX Runtime build offers (may still fail
    to load: see `unavailable_reason`)."""
    offered = set(ort.get_available_providers())
    return [short for short, full in PROVIDERS.items() if full in offered]


def parse_eps(spec: str) -> list[str]:
    """'cpu', 'cpu,cuda' or 'all' -> list of short names; unknown names are a usage error.
    'all' means every provider that really runs here: naming a provider is asking for it (and
    its absence is exit 3), 'all' is not."""
    if spec.strip() == "all":
        return [ep for ep in available_eps() if unavailable_reason(ep) is None]
    names = [n.strip().lower() for n in spec.split(",") if n.strip()]
    if not names:
        raise UsageError(f"--ep {spec!r} names no execution provider (e.g. cpu, cpu,cuda, all)")
    for n in names:
        if n not in PROVIDERS:
            raise UsageError(
                f"unknown execution provider {n!r}; tconform supports {', '.join(PROVIDERS)} "
                f"(this ONNX Runtime offers {', '.join(available_eps()) or 'none'}) or 'all'"
            )
    return names


def parse_provider_options(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """['use_tf32=0', 'device_id=1'] -> {'use_tf32': '0', 'device_id': '1'}; a later key wins."""
    options: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value or any(c.isspace() for c in key):
            raise UsageError(f"provider option {item!r} is not KEY=VALUE (e.g. use_tf32=0)")
        options[key] = value
    return options


def _short_name(provider: str) -> str:
    for short, full in PROVIDERS.items():
        if full == provider:
            return short
    return provider.removesuffix("ExecutionProvider").lower()


# ---------------------------------------------------------------------------------------------
# Why a provider did not load: ONNX Runtime only logs it, from C++, to file descriptor 2.

_ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Redirect file descriptor 2 (where ONNX Runtime's C++ logger writes) into a temp file;
    the yielded list receives the captured text when the block ends."""
    captured: list[str] = []
    sys.stderr.flush()
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.append(sink.read().decode(errors="replace"))


def reason_from_log(log: str) -> str | None:
    """The line of ONNX Runtime's log that says why a provider did not load, shortened to
    its cause (the missing library, 'no CUDA-capable device is detected', ...)."""
    lines = [_ANSI_COLOUR.sub("", ln).strip() for ln in log.splitlines()]
    lines = [ln for ln in lines if ln]
    for ln in lines:  # "Failed to load library .../libonnxruntime_providers_cuda.so with error: X"
        found = re.search(r"with error: (.+)$", ln)
        if found:
            return found.group(1).strip()
    for ln in lines:  # a CUDA runtime error, e.g. "CUDA failure 100: no CUDA-capable device ..."
        found = re.search(r"(CUDA failure \d+: [^;]+|no CUDA-capable device[^;]*)", ln)
        if found:
            return found.group(1).strip()
    for level in ("[E:", "[W:"):  # otherwise the first error, else warning, without its prefix
        for ln in lines:
            if level in ln:
                message = ln.split("] ", 1)[-1]
                return message.split(" : ")[-1].strip() if " : " in message else message
    return None


def _probe_model() -> bytes:
    """A one-node float model, small enough to build in memory for every probe."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model.SerializeToString()


@functools.cache
def unavailable_reason(ep: str) -> str | None:
    """None when provider `ep` really runs here; otherwise ONNX Runtime's own reason.

    Probed once per process with a one-node model, since loading a provider library can take
    seconds and its outcome does not change while the process lives.
    """
    provider = PROVIDERS[ep]
    if provider not in ort.get_available_providers():
        return f"this ONNX Runtime build ({ort.get_device()}) has no {provider}"
    if provider == "CPUExecutionProvider":
        return None
    with _captured_stderr() as log:
        session = ort.InferenceSession(_probe_model(), providers=[provider, "CPUExecutionProvider"])
    if provider in session.get_providers():
        return None
    return reason_from_log(log[0]) or "ONNX Runtime fell back to the CPU and logged no reason"


# ---------------------------------------------------------------------------------------------
# Runtime and session


@dataclass
class OrtRuntime:
    """Creates sessions on one provider with recorded settings."""

    ep: str = "cpu"
    graph_opt: str = "all"
    intra_op_threads: int = 0  # 0: ONNX Runtime's default (one per physical core)
    provider_options: dict[str, str] = field(default_factory=dict)  # raw, from the CLI
    tf32: bool = False  # CUDA only: allow TF32 matrix products
    device_id: int = 0  # CUDA only

    @property
    def name(self) -> str:
        return f"onnxruntime-{self.ep}"

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
            "onnxruntime": ort.__version__,
        }

    def session_options(self) -> ort.SessionOptions:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = GRAPH_OPT_LEVELS[self.graph_opt]
        opts.intra_op_num_threads = self.intra_op_threads
        opts.log_severity_level = 3  # errors only; fallbacks are detected from get_providers()
        opts.add_session_config_entry(RECORD_ASSIGNMENT, "1")
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
        with _captured_stderr() as log:
            try:
                session = ort.InferenceSession(
                    str(model_path), self.session_options(), providers=providers
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
        placement, fallback_ops = assignment(session, self.provider)
        return OrtSession(session, actual, placement, fallback_ops)

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
        placement[_short_name(subgraph.ep_name)] += len(nodes)
        if subgraph.ep_name == "CPUExecutionProvider" and requested != "CPUExecutionProvider":
            fallback_ops.update(n.op_type for n in nodes if n.op_type not in _COPY_OPS)
    return dict(placement), dict(fallback_ops)


@dataclass
class OrtSession:
    session: ort.InferenceSession
    providers: list[str]  # get_providers(): what ONNX Runtime really registered
    placement: dict[str, int] = field(default_factory=dict)  # provider short name -> nodes
    fallback_ops: dict[str, int] = field(default_factory=dict)  # op type -> nodes left on CPU

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.session.get_inputs()]

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, feeds)
