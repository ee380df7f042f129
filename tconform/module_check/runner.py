"""`tconform.check`: export any PyTorch module (or take an ONNX file made elsewhere), run it on
each requested ONNX Runtime provider, and judge every output against the module's own float64
copy; on a failure (or when asked), name the first submodule that diverges.

Results are the same `Result` rows as `tconform verify` (one per provider, plus PyTorch float32
eager as its own row), with provenance on each, and the same exit-code rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from tconform.compare import Tolerance, compare_output, tolerance_for
from tconform.errors import ProviderUnavailable, UsageError
from tconform.files import sha256_file
from tconform.models import load_checked
from tconform.module_check.exporting import (
    DEFAULT_OPSET,
    default_export_dir,
    export_module,
    require_own_export_folder,
)
from tconform.module_check.inputs import ModuleInputs, as_inputs, parse_dynamic
from tconform.module_check.localise import Localisation
from tconform.module_check.localise import localise as localise_model
from tconform.module_check.oracle import (
    Reference,
    build_reference,
    eval_mode,
    floating_dtype,
    module_device,
    run_module,
)
from tconform.provenance import ModelProvenance, module_provenance, onnx_provenance
from tconform.report import RunReport, json_report
from tconform.results import Result, allow_missing
from tconform.runtimes import label
from tconform.runtimes.onnxruntime import KernelMissing, OrtRuntime, OrtSession
from tconform.runtimes.providers import parse_eps

Progress = Callable[[str], None]

# Tolerance class for a module nobody has measured: the loosest float32 row (a whole model).
DEFAULT_TOLERANCE_CLASS = "model"

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
}


@dataclass
class Report(RunReport):
    """What `tconform.check` found: verify's report (result rows, settings, environment, exit
    code) plus the localisations, which the JSON carries as its `details`."""

    command: str = "check"
    localisations: list[Localisation] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    def to_dict(self) -> dict[str, object]:
        return json_report.build(self)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _precision(module: nn.Module) -> str:
    return "float16" if floating_dtype(module) == torch.float16 else "float32"


@dataclass(frozen=True)
class Tolerances:
    """The tolerances of a check: the "model" row of tconform.compare.TOLERANCES for the run's
    precision (float32, tf32 or float16), unless atol/rtol override it, then per-output
    overrides."""

    outputs: tuple[str, ...]
    atol: float | None = None
    rtol: float | None = None
    per_output: tuple[tuple[str, tuple[float, float]], ...] = ()

    def __post_init__(self) -> None:
        for name, _ in self.per_output:
            if name not in self.outputs:
                raise UsageError(
                    f"--tolerance {name}=...: the module has no output {name!r} "
                    f"(its outputs: {', '.join(self.outputs)})"
                )

    def module(self, precision: str) -> Tolerance:
        """For the module as a whole (and every boundary localisation compares)."""
        row = tolerance_for(precision, DEFAULT_TOLERANCE_CLASS)
        if self.atol is None and self.rtol is None:
            return row
        return Tolerance(
            row.atol if self.atol is None else self.atol,
            row.rtol if self.rtol is None else self.rtol,
            "set by the user",
        )

    def by_output(self, precision: str) -> dict[str, Tolerance]:
        overrides = dict(self.per_output)
        return {
            name: Tolerance(*overrides[name], "set by the user for this output")
            if name in overrides
            else self.module(precision)
            for name in self.outputs
        }


def parse_tolerance(items: Sequence[str]) -> dict[str, tuple[float, float]]:
    """['logits=1e-4,1e-4'] -> {'logits': (1e-4, 1e-4)}."""
    parsed = {}
    for item in items:
        name, sep, values = item.partition("=")
        parts = values.split(",")
        try:
            atol, rtol = (float(p) for p in parts)
        except ValueError:
            atol = rtol = -1.0
        if not sep or not name.strip() or len(parts) != 2 or atol < 0 or rtol < 0:
            raise UsageError(f"--tolerance {item!r}: expected OUTPUT=ATOL,RTOL, e.g. out=1e-4,1e-4")
        parsed[name.strip()] = (atol, rtol)
    return parsed


def _feeds(session: OrtSession, inputs: ModuleInputs, model: Path) -> dict[str, np.ndarray]:
    """The module's inputs by the model's input names (by position where the names differ, as
    in a model exported elsewhere), in the element types the model declares."""
    named = inputs.feeds()
    declared = {i.name: i.type for i in session.session.get_inputs()}
    if not set(declared) <= set(named):
        if len(declared) != len(named):
            raise UsageError(
                f"{model}: takes inputs {', '.join(declared)}; the module is called with "
                f"{', '.join(named)}"
            )
        named = dict(zip(declared, named.values(), strict=True))
    feeds = {}
    for name, ort_type in declared.items():
        value = named[name]
        wanted = _ORT_TYPES.get(ort_type)
        feeds[name] = value.astype(wanted) if wanted and value.dtype.kind == "f" else value
    return feeds


def _judge(result: Result, outputs: list[np.ndarray], reference: Reference, tolerances) -> None:
    names = list(reference.outputs)
    if len(outputs) != len(names):
        raise UsageError(
            f"{result.model.path if result.model else result.case}: returns {len(outputs)} "
            f"outputs; the module {len(names)}"
        )
    result.outputs = [
        compare_output(name, actual, reference.outputs[name], tolerances[name])
        for name, actual in zip(names, outputs, strict=True)
    ]
    failed = [o for o in result.outputs if o.status == "fail"]
    result.status = "fail" if failed else "pass"
    result.message = "; ".join(f"{o.name}: {o.message}" for o in failed)


def _run_precision(runtime: OrtRuntime, template: Result) -> str:
    """tf32 where the CUDA provider may use it, else the module's own (float32 or float16)."""
    return runtime.precision if runtime.precision != "float32" else template.precision


def _ort_result(
    template: Result,
    runtime: OrtRuntime,
    model: Path,
    inputs: ModuleInputs,
    reference: Reference,
    tolerances: Tolerances,
) -> tuple[Result, dict[str, np.ndarray] | None]:
    """The model on one provider, judged; with the feeds it ran on (None where it did not)."""
    precision = _run_precision(runtime, template)
    result = Result(**{**template.__dict__, "ep": runtime.ep, "precision": precision, "notes": []})
    result.notes = list(template.notes)
    try:
        session = runtime.open(model)
    except (ProviderUnavailable, KernelMissing) as exc:
        unavailable = isinstance(exc, ProviderUnavailable)
        result.status, result.message = ("unavailable" if unavailable else "skip"), str(exc)
        return result, None
    result.ep_actual = list(session.providers)
    result.placement = dict(session.placement)
    result.fallback_ops = dict(session.fallback_ops)
    if result.fallback_ops:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(result.fallback_ops.items()))
        result.notes.insert(0, f"warning: nodes fell back to the CPU provider: {ops}")
    feeds = _feeds(session, inputs, model)
    started = time.perf_counter()
    try:
        outputs = session.run(feeds)
    except Exception as exc:  # a runtime error on valid input is a conformance failure
        result.status, result.message = "error", _first_line(exc)
    else:
        _judge(result, outputs, reference, tolerances.by_output(precision))
    result.seconds = time.perf_counter() - started
    return result, feeds


def _localise(
    result: Result,
    model: Path,
    reference: Reference,
    feeds: dict[str, np.ndarray],
    runtime: OrtRuntime,
    tol: Tolerance,
) -> Localisation | None:
    """Localise `result`'s run; its verdict joins the result's notes (and message on a fail)."""
    try:
        loc = localise_model(
            model, reference.module, reference.inputs, feeds, runtime, tol, result.model
        )
    except Exception as exc:  # localisation explains a result; it never replaces one
        result.notes.append(f"localisation could not run: {_first_line(exc)}")
        return None
    result.notes.append(f"localisation: {loc.verdict}")
    if result.status == "fail" and loc.first is not None:
        result.message += f"; first divergence: {loc.first.label} ({loc.first.cls})"
    return loc


def _given_model(path: Path) -> ModelProvenance:
    """A file made elsewhere: checked like verify's --model files (regular, sane size, ONNX,
    external data inside its folder), only ever read."""
    return onnx_provenance(path, "given", sha256_file(path), load_checked(path))


def _run_eagerly(module: nn.Module, inputs: ModuleInputs, name: str):
    """The module as it is (its own dtype, eval mode): its outputs and the seconds it took."""
    started = time.perf_counter()
    try:
        with eval_mode(module):
            outputs = run_module(module, inputs)
    except Exception as exc:
        raise UsageError(f"{name}: the module rejects its inputs: {_first_line(exc)}") from None
    if not outputs:
        raise UsageError(f"{name}: the module returns no tensor")
    return outputs, time.perf_counter() - started


def check(
    module: nn.Module,
    example_inputs: object,
    *,
    eps: Sequence[str] | str = ("cpu",),
    exporter: str = "dynamo",
    opset: int = DEFAULT_OPSET,
    dynamic: dict[str, dict[int, str]] | Sequence[str] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    tolerances: dict[str, tuple[float, float]] | None = None,
    onnx_model: str | Path | None = None,
    out_dir: str | Path | None = None,
    localise: bool | None = None,
    with_torch: bool = True,
    allow_missing_ep: bool = False,
    tf32: bool = False,
    name: str | None = None,
    input_set: str = "example",
    progress: Progress = lambda _: None,
) -> Report:
    """Check `module` called with `example_inputs` (a tensor, a tuple of tensors, or a dict of
    keyword tensors) on ONNX Runtime against its own float64 copy.

    eps: providers ("cpu", "cuda", or a spec such as "cpu,cuda" or "all"). dynamic: dynamic axes,
    {input: {axis: name}} or ["NAME=AXES", ...] as on the command line. atol/rtol: override
    the default (the "model" row of tconform.compare.TOLERANCES); tolerances: per output,
    {output: (atol, rtol)}. onnx_model: an ONNX file made elsewhere to check instead of exporting
    (read-only). out_dir: where the export goes (default artifacts/check/<name>). localise:
    True localises on every provider, None (default) only where an output fails, False never.
    """
    name = name or type(module).__name__
    inputs = as_inputs(module, example_inputs, name)
    ep_list = parse_eps(eps if isinstance(eps, str) else ",".join(eps))
    dynamic_axes = dynamic if isinstance(dynamic, dict) else parse_dynamic(dynamic or (), inputs)
    for input_name in dynamic_axes:
        if input_name not in inputs.names:
            raise UsageError(f"dynamic axes: the module has no input {input_name!r}")
    export_dir = Path(out_dir or default_export_dir(name))
    if onnx_model is None:
        require_own_export_folder(export_dir)  # before anything slow runs

    progress(f"{name}: running the module in eager mode")
    device = module_device(module)
    own_inputs = inputs.converted(None, device)
    eager, eager_seconds = _run_eagerly(module, own_inputs, name)
    output_names = [n for n, _ in eager]
    tols = Tolerances(tuple(output_names), atol, rtol, tuple((tolerances or {}).items()))
    progress(f"{name}: running its float64 copy (the reference)")
    reference = build_reference(module, inputs, name)

    if onnx_model is not None:
        model_path = Path(onnx_model)
        provenance = _given_model(model_path)
    else:
        model_path = export_dir / "model.onnx"
        progress(f"{name}: exporting with {exporter} to {model_path}")
        export_module(
            module, own_inputs, output_names, model_path, exporter, opset, dynamic_axes, name
        )
        provenance = onnx_provenance(
            model_path, "exported", sha256_file(model_path), load_checked(model_path)
        )

    cls = type(module)
    template = Result(
        case=name,
        component=f"{cls.__module__}.{cls.__qualname__}",
        runtime="onnxruntime",
        ep="",
        ep_actual=[],
        input_set=input_set,
        status="pass",
        precision=_precision(module),
        notes=reference.notes,
        model=provenance,
        reference=reference.kind,
    )
    results: list[Result] = []
    localisations: list[Localisation] = []
    runtimes = [OrtRuntime(ep, tf32=tf32) for ep in ep_list]
    for runtime in runtimes:
        progress(f"{name}: running {model_path} on {label(runtime)}")
        result, feeds = _ort_result(template, runtime, model_path, inputs, reference, tols)
        results.append(result)
        wanted = localise or (localise is None and result.status == "fail")
        if feeds is not None and result.status in ("pass", "fail") and wanted:
            progress(f"{name}: localising on {label(runtime)}")
            tol = tols.module(result.precision)
            loc = _localise(result, model_path, reference, feeds, runtime, tol)
            localisations += [loc] if loc else []
    if with_torch:
        row = Result(**template.__dict__)
        row.runtime, row.ep, row.ep_actual = "torch", device.type, [f"torch-{device.type}"]
        row.model = module_provenance(module, template.precision)
        row.notes, row.seconds = list(reference.notes), eager_seconds
        eager_outputs = [t.detach().cpu().numpy() for _, t in eager]
        _judge(row, eager_outputs, reference, tols.by_output(template.precision))
        results.append(row)

    settings = {
        "module": name,
        "class": template.component,
        "input_set": input_set,
        "inputs": {
            n: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
            for n, t in inputs.named().items()
        },
        "outputs": output_names,
        "model": str(model_path),
        "exporter": None if onnx_model is not None else exporter,
        "opset": None if onnx_model is not None else opset,
        "dynamic": {n: {str(a): d for a, d in axes.items()} for n, axes in dynamic_axes.items()},
        "reference": reference.kind,
        "reference_model": module_provenance(reference.module, reference.kind).to_dict(),
        # the row of TOLERANCES and the user's overrides; each output's atol/rtol is in results
        "tolerance": {
            "class": DEFAULT_TOLERANCE_CLASS,
            "atol": atol,
            "rtol": rtol,
            "per_output": {n: list(t) for n, t in tols.per_output},
        },
        "eps": ep_list,
        "runtimes": {label(r): r.settings() for r in runtimes},
    }
    if allow_missing_ep:
        allow_missing(results)
    return Report(
        results=results,
        settings=settings,
        localisations=localisations,
        details={"localisation": [loc.to_dict() for loc in localisations]},
    )
