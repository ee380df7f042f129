"""The result of running one case (or doc check) on one runtime and input set.

Its dict form is the stable JSON schema documented in the README ("JSON report").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tconform.compare import OutputComparison

STATUSES = ("pass", "fail", "skip", "error", "unavailable")


@dataclass
class Result:
    case: str
    component: str
    runtime: str  # "onnxruntime" or "torch" (or "oracle" for document checks)
    ep: str  # requested: cpu, cuda
    ep_actual: list[str]  # what the session really used (get_providers() for ONNX Runtime)
    input_set: str
    status: str
    message: str = ""
    precision: str = "float32"  # float32, tf32 or float16
    outputs: list[OutputComparison] = field(default_factory=list)
    placement: dict[str, int] = field(default_factory=dict)  # provider -> node count
    fallback_ops: dict[str, int] = field(default_factory=dict)  # op type -> count on CPU
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # facts worth knowing even on a pass

    @property
    def worst_used(self) -> float | None:
        used = [o.tolerance_used for o in self.outputs if o.tolerance_used is not None]
        return max(used) if used else None

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["outputs"] = [o.to_dict() for o in self.outputs]
        return data
