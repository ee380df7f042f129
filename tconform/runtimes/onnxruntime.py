"""ONNX Runtime sessions on one execution provider, with the placement checked.

ONNX Runtime's GPU build falls back to the CPU silently when a provider cannot load: the session
is created and `get_providers()` simply lacks the requested provider. A session whose actual
providers lack the requested one is refused here (ProviderUnavailable), so that it can never be
reported as that provider's pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tconform.errors import ProviderUnavailable, UsageError

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


def available_eps() -> list[str]:
    """Short names of the supported providers this ONNX Runtime build offers."""
    offered = set(ort.get_available_providers())
    return [short for short, full in PROVIDERS.items() if full in offered]


def parse_eps(spec: str) -> list[str]:
    """'cpu', 'cpu,cuda' or 'all' -> list of short names; unknown names are a usage error."""
    if spec == "all":
        return available_eps()
    names = [n.strip().lower() for n in spec.split(",") if n.strip()]
    for n in names:
        if n not in PROVIDERS:
            raise UsageError(
                f"unknown execution provider {n!r}; tconform supports {', '.join(PROVIDERS)} "
                f"(this ONNX Runtime offers {', '.join(available_eps()) or 'none'}) or 'all'"
            )
    return names


@dataclass
class OrtRuntime:
    """Creates sessions on one provider with recorded settings."""

    ep: str = "cpu"
    graph_opt: str = "all"
    intra_op_threads: int = 0  # 0: ONNX Runtime's default (one per physical core)
    provider_options: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"onnxruntime-{self.ep}"

    def session_options(self) -> ort.SessionOptions:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = GRAPH_OPT_LEVELS[self.graph_opt]
        opts.intra_op_num_threads = self.intra_op_threads
        opts.log_severity_level = 3  # errors only; fallbacks are detected from get_providers()
        return opts

    def open(self, model_path: Path) -> OrtSession:
        requested = PROVIDERS[self.ep]
        providers: list = [(requested, self.provider_options)] if self.provider_options else [requested]
        if requested != "CPUExecutionProvider":
            providers.append("CPUExecutionProvider")
        try:
            session = ort.InferenceSession(
                str(model_path), self.session_options(), providers=providers
            )
        except Exception as exc:  # ORT raises its own exception types for corrupt models
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"{model_path}: ONNX Runtime cannot load it: {first}") from None
        actual = session.get_providers()
        if requested not in actual:
            raise ProviderUnavailable(
                f"{self.ep}: ONNX Runtime created the session on {', '.join(actual)} only"
            )
        return OrtSession(session, actual)


@dataclass
class OrtSession:
    session: ort.InferenceSession
    providers: list[str]

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.session.get_inputs()]

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, feeds)
