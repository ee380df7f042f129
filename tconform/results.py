"""The result of running one case (or doc check) on one runtime and input set, the status
vocabulary every command shares, and the one rule that turns statuses into an exit code.

Its dict form is the stable JSON schema documented in the README ("JSON report").
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import Enum

from tconform.compare import OutputComparison
from tconform.errors import EXIT_EP_UNAVAILABLE, EXIT_FAILURE, EXIT_OK
from tconform.provenance import ModelProvenance


class Status(str, Enum):
    """What happened to one check. A str, so it compares equal to its value and serialises
    as one in JSON."""

    PASS = "pass"  # ran and agreed with the expected outputs within tolerance
    FAIL = "fail"  # ran and disagreed (a conformance failure)
    ERROR = "error"  # the runtime raised on valid input (a conformance failure)
    # the runtime's worker process crashed, hung or was killed (a conformance failure; the
    # message names the signal: tconform.runtimes.remote)
    CRASH = "crash"
    UNAVAILABLE = "unavailable"  # a requested provider could not run (environment)
    SKIP = "skip"  # not run, with the reason (--allow-missing-ep, a missing fp16 kernel)
    TIE = "tie"  # generation: tokens split where the oracle's margin is within tolerance

    def __str__(self) -> str:
        return self.value


FAILING = frozenset({Status.FAIL, Status.ERROR, Status.CRASH})
CHECKED = frozenset({Status.PASS, Status.TIE})  # ran and was judged


def nothing_checked(statuses: Iterable[str]) -> bool:
    return not {Status(s) for s in statuses} & (CHECKED | FAILING)


def unchecked_lanes(lanes: Iterable[Result], results: Iterable[Result]) -> str:
    """Why a run checked no model ('' when it checked one, or failed): it has model `lanes`
    (the rows that run an ONNX model), and every one of them was skipped or could not run (not
    applicable, no kernel, a provider absent). Rows that check something else (the reference
    module, the oracle against the documents) do not make it a check of a model: every
    command exits 3 on this (tconform.units.unchecked_models is verify's lanes)."""
    lanes = list(lanes)
    checked = any(Status(r.status) in CHECKED | FAILING for r in lanes)
    if not lanes or checked or any(Status(r.status) in FAILING for r in results):
        return ""
    reasons = list(dict.fromkeys(r.message or f"{r.status} (no reason recorded)" for r in lanes))
    more = f" (and {len(reasons) - 1} other reasons)" if len(reasons) > 1 else ""
    return f"nothing checked: every ONNX lane was skipped or could not run: {reasons[0]}{more}"


def exit_code(statuses: Iterable[str]) -> int:
    """The exit code of every command (README, "Exit codes"): a conformance failure outranks
    an unavailable provider, which outranks a pass. Nothing checked is never a pass: a run
    whose every result was skipped (`--allow-missing-ep` on a machine without the provider,
    a missing kernel) exits as a provider that could not run."""
    seen = {Status(s) for s in statuses}
    if seen & FAILING:
        return EXIT_FAILURE
    if Status.UNAVAILABLE in seen or nothing_checked(seen):
        return EXIT_EP_UNAVAILABLE
    return EXIT_OK


def allow_missing(results: list[Result]) -> list[Result]:
    """--allow-missing-ep, the same in every command: an unavailable provider becomes `skip`,
    its reason kept, so the run can pass where a provider is absent by design."""
    for result in results:
        if result.status == Status.UNAVAILABLE:
            result.status = Status.SKIP.value
            result.message = f"provider unavailable (--allow-missing-ep): {result.message}"
    return results


@dataclass
class Result:
    case: str
    component: str
    runtime: str  # a name of tconform.runtimes.RUNTIMES ("oracle" for document checks)
    ep: str  # requested: cpu, cuda
    ep_actual: list[str]  # what the session really used (get_providers() for ONNX Runtime)
    input_set: str
    status: str
    message: str = ""
    precision: str = "float32"  # float32, tf32, bfloat16 or float16: picks the tolerance row
    outputs: list[OutputComparison] = field(default_factory=list)
    placement: dict[str, int] = field(default_factory=dict)  # provider -> node count
    fallback_ops: dict[str, int] = field(default_factory=dict)  # op type -> count on CPU
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # facts worth knowing even on a pass
    model: ModelProvenance | None = None  # the exact bytes (or module) that ran
    # What the expected outputs were computed in: float64 (the golden, check's float64 copy), or
    # float32 where check's float64 copy could not run. A JSON field name kept for the schema;
    # "reference" elsewhere means tconform's PyTorch reference modules (docs/design.md).
    reference: str = "float64"
    cell: str = ""  # verify: the cell it ran in (tconform.plan; e.g. dynamo-opset18-float32-all)
    unit: str = ""  # verify: the id of its work unit (tconform.units.unit_id)

    @classmethod
    def about(cls, case: str, component: str, **known: object) -> Result:
        """A row as a command knows it before anything ran: the execution layer fills in the
        runtime, what ran and the verdict (tconform.execution)."""
        blank = {"runtime": "", "ep": "", "ep_actual": [], "input_set": "", "status": "pass"}
        return cls(case=case, component=component, **{**blank, **known})

    @property
    def worst_used(self) -> float | None:
        used = [o.tolerance_used for o in self.outputs if o.tolerance_used is not None]
        return max(used) if used else None

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["status"] = str(self.status)
        data["outputs"] = [o.to_dict() for o in self.outputs]
        data["model"] = self.model.to_dict() if self.model else None
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Result:
        """The inverse of `to_dict` (a JSON report's result, read back by `report merge`);
        ValueError naming the field for anything `to_dict` could not have written."""
        values = checked_fields(cls, data)
        values["status"] = str(Status(values["status"]))  # ValueError for a status tconform lacks
        values["outputs"] = [
            OutputComparison(**checked_fields(OutputComparison, o)) for o in data.get("outputs", [])
        ]
        model = data.get("model")
        values["model"] = (
            ModelProvenance(**checked_fields(ModelProvenance, model)) if model else None
        )
        return cls(**values)


def checked_fields(cls: type, data: object) -> dict:
    """`data` (a JSON object) as keyword arguments of the dataclass `cls`, every value checked
    against its field's type hint, so that a report read back cannot put a number where a name
    belongs; ValueError naming the field otherwise."""
    if not isinstance(data, dict):
        raise ValueError(f"a {cls.__name__} must be an object, not {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for name, value in data.items():
        if name not in known:
            raise ValueError(f"{cls.__name__} has no field {name!r}")
        if not _matches(value, hints[name]):
            kind = getattr(hints[name], "__name__", str(hints[name]))
            raise ValueError(f"{name} {value!r}: expected {kind} (numbers finite)")
    return dict(data)


def _matches(value: object, hint: object) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is float:  # tconform writes only finite numbers; JSON has no Infinity or NaN
        return (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (str, bool):
        return isinstance(value, hint)
    if origin is list:
        return isinstance(value, list) and all(_matches(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items()
        )
    if dataclasses.is_dataclass(hint):
        return isinstance(value, dict)  # its own fields are checked where it is built
    return hint is object
