"""`tconform.check`: export any PyTorch module (or take an ONNX file made elsewhere), run it on
each requested runtime and provider through the execution layer, and judge every output against
the module's own float64 copy; on a failure (or when asked), name the first submodule that
diverges.

Results are the same `Result` rows as `tconform verify` (one per runtime and provider, PyTorch
eager on the module itself as its own row), with provenance on each, and the same exit-code
rule.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from torch import nn

from tconform.compare import Tolerance, judge_outputs, tolerance_for, tolerance_value
from tconform.errors import (
    EndedByUserCode,
    Terminated,
    UsageError,
    calling_user_code,
    first_line,
)
from tconform.execution import Subject, execute
from tconform.golden import InputSet
from tconform.heap import trim
from tconform.localise import ISOLATE, Localisation
from tconform.localise import localise as localise_model
from tconform.localise.versions import Parting, add_version_runs, version_partings
from tconform.models import ModelUnderTest, given_file
from tconform.module_check.exporting import (
    DEFAULT_OPSET,
    EXPORTERS,
    default_export_dir,
    export_module,
    require_own_export_folder,
)
from tconform.module_check.float64_copy import (
    Float64Copy,
    build_float64_copy,
    floating_dtype,
    module_device,
    run_module,
)
from tconform.module_check.inputs import ModuleInputs, as_inputs, parse_dynamic
from tconform.report import RunReport, json_report
from tconform.results import Result, allow_missing
from tconform.runtimes import (
    ModuleTarget,
    Runtime,
    RuntimeOptions,
    label,
    make_runtime,
    make_runtimes,
    runtime_class,
)
from tconform.runtimes.providers import parse_eps
from tconform.runtimes.torch import eval_mode

Progress = Callable[[str], None]

# Tolerance class for a module nobody has measured: the loosest float32 row (a whole model).
DEFAULT_TOLERANCE_CLASS = "model"
# The exporter setting that tries dynamo, then TorchScript where dynamo fails.
AUTO = "auto"


@dataclass
class Report(RunReport):
    """What `tconform.check` found: verify's report (result rows, settings, environment, exit
    code) plus the localisations, which the JSON carries as its `details`."""

    command: str = "check"
    localisations: list[Localisation] = field(default_factory=list)
    partings: list[Parting] = field(default_factory=list)  # where versions of a runtime part

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    def to_dict(self) -> dict[str, object]:
        return json_report.build(self)


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
        # Finite and >= 0 whoever gives them (the command line's types check the same): NaN
        # passes nothing, infinity everything, and a report holds neither.
        for what in ("atol", "rtol"):
            value = getattr(self, what)
            if value is not None:
                object.__setattr__(self, what, tolerance_value(value, what))
        checked = []
        for item in self.per_output:
            try:
                name, (atol, rtol) = item
            except (TypeError, ValueError):
                raise UsageError(f"tolerances: {item!r} is not OUTPUT: (ATOL, RTOL)") from None
            where = f"--tolerance {name}"
            checked.append(
                (
                    name,
                    (
                        tolerance_value(atol, f"{where} atol"),
                        tolerance_value(rtol, f"{where} rtol"),
                    ),
                )
            )
            if name not in self.outputs:
                raise UsageError(
                    f"--tolerance {name}=...: the module has no output {name!r} "
                    f"(its outputs: {', '.join(self.outputs)})"
                )
        object.__setattr__(self, "per_output", tuple(checked))

    def module(self, precision: str) -> Tolerance:
        """For the module as a whole (and every boundary localisation compares)."""
        row = tolerance_for(precision, DEFAULT_TOLERANCE_CLASS)
        if self.atol is None and self.rtol is None:
            # The row's own reason describes tconform's Transformer, not the user's module.
            why = f"tconform's {precision} {DEFAULT_TOLERANCE_CLASS} row, check's default"
            return replace(row, why=why)
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
    """['logits=1e-4,1e-4'] -> {'logits': (1e-4, 1e-4)}; each value finite and >= 0."""
    parsed = {}
    for item in items:
        name, sep, values = item.partition("=")
        parts = values.split(",")
        expected = f"--tolerance {item!r}: expected OUTPUT=ATOL,RTOL, e.g. out=1e-4,1e-4"
        if not sep or not name.strip() or len(parts) != 2:
            raise UsageError(expected)
        try:
            atol, rtol = (tolerance_value(part.strip(), part.strip()) for part in parts)
        except UsageError as exc:
            raise UsageError(f"{expected} ({exc})") from None
        parsed[name.strip()] = (atol, rtol)
    return parsed


def _localise(
    result: Result,
    model: ModelUnderTest,
    float64_copy: Float64Copy,
    feeds: dict[str, np.ndarray],
    runtime: Runtime,
    tol: Tolerance,
    isolate: str,
    repro: Path | None,
    command: str,
    keep: np.ndarray | None,
) -> Localisation | None:
    """Localise `result`'s run; its verdict joins the result's notes (and message on a fail)."""
    try:
        loc = localise_model(
            model, float64_copy.calls, float64_copy.tree, feeds, runtime, tol, result.model,
            isolate, repro, command, keep,
        )  # fmt: skip
    except (KeyboardInterrupt, Terminated):
        raise
    except BaseException as exc:  # localisation explains a result; it never replaces one
        result.notes.append(f"localisation could not run: {first_line(exc)}")
        return None
    result.notes.append(f"localisation: {loc.verdict}")
    if result.status == "fail" and loc.first is not None:
        result.message += f"; first divergence: {loc.first.label} ({loc.first.cls})"
    return loc


def _export(
    module: nn.Module,
    inputs: ModuleInputs,
    output_names: list[str],
    path: Path,
    exporter: str,
    opset: int,
    dynamic: dict[str, dict[int, str]],
    name: str,
    progress: Progress,
) -> tuple[str, str]:
    """Export with `exporter`; "auto" tries dynamo, then TorchScript. (the exporter that ran,
    why: "" unless auto had to fall back)."""
    if exporter not in (*EXPORTERS, AUTO):
        raise UsageError(f"exporter {exporter!r}: one of {', '.join((*EXPORTERS, AUTO))}")
    if exporter != AUTO:
        progress(f"{name}: exporting with {exporter} to {path}")
        export_module(module, inputs, output_names, path, exporter, opset, dynamic, name)
        return exporter, ""
    progress(f"{name}: exporting with dynamo to {path} (auto)")
    try:
        export_module(module, inputs, output_names, path, "dynamo", opset, dynamic, name)
        return "dynamo", ""
    except EndedByUserCode:
        raise  # the module ended itself: no exporter's limit for TorchScript to get round
    except UsageError as exc:
        failed = str(exc).split(" (full log:")[0]
    progress(f"{name}: dynamo failed; exporting with torchscript (auto)")
    export_module(module, inputs, output_names, path, "torchscript", min(opset, 20), dynamic, name)
    return (
        "torchscript",
        f"exported by TorchScript (--exporter auto), since dynamo failed: {failed}",
    )


def _run_eagerly(module: nn.Module, inputs: ModuleInputs, name: str):
    """The module as it is (its own dtype, eval mode): its outputs."""
    with calling_user_code(f"{name}: the module rejects its inputs"), eval_mode(module):
        outputs = run_module(module, inputs)
    if not outputs:
        raise UsageError(f"{name}: the module returns no tensor")
    return outputs


def _runtimes(options: RuntimeOptions, module: nn.Module) -> list[Runtime]:
    """The ONNX runtimes on each provider; the module runtimes (torch eager) on the module's
    own device and in its own dtype: they check the module as the user runs it."""
    device, dtype = module_device(module), floating_dtype(module)
    own = {
        "dtype": str(dtype).removeprefix("torch."),
        "device_id": device.index or 0,
    }
    runtimes = make_runtimes(options, consumes="onnx")
    for name in options.names:
        if runtime_class(name).consumes == "module":
            runtimes.append(make_runtime(name, device.type, **own))
    return runtimes


def check(
    module: nn.Module,
    example_inputs: object,
    *,
    eps: Sequence[str] | str = ("cpu",),
    runtimes: Sequence[str] = ("onnxruntime", "torch"),
    exporter: str = AUTO,
    opset: int = DEFAULT_OPSET,
    dynamic: dict[str, dict[int, str]] | Sequence[str] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    tolerances: dict[str, tuple[float, float]] | None = None,
    onnx_model: str | Path | None = None,
    out_dir: str | Path | None = None,
    localise: bool | None = None,
    allow_missing_ep: bool = False,
    tf32: bool = False,
    bf16: bool = False,
    name: str | None = None,
    input_set: str = "example",
    isolate: str = "first",
    repro: str | Path | None = None,
    padding_mask: str | None = None,
    command: str = "",
    crash_folder: str | Path | None = None,
    progress: Progress = lambda _: None,
) -> Report:
    """Check `module` called with `example_inputs` (a tensor, a tuple of tensors, or a dict of
    keyword tensors) against its own float64 copy, on each runtime and provider.

    eps: providers ("cpu", "cuda", or a spec such as "cpu,cuda" or "all"). runtimes: names in
    tconform.runtimes.RUNTIMES; the ONNX ones run the exported (or given) model on every
    provider, the module ones (torch) the module itself. dynamic: dynamic axes,
    {input: {axis: name}} or ["NAME=AXES", ...] as on the command line. atol/rtol: override the
    default (the "model" row of tconform.compare.TOLERANCES); tolerances: per output,
    {output: (atol, rtol)}. onnx_model: an ONNX file made elsewhere to check instead of
    exporting (read-only). out_dir: where the export goes (default artifacts/check/<name>).
    localise: True localises on every ONNX runtime, None (default) only where an output fails,
    False never. isolate: "first" (default) cuts the first divergent module out of the model and
    runs it on the reference's inputs, "all" every module, "none" none; repro: a folder for the
    first divergence's bundle (the cut, its inputs and expected outputs, a README); command: how
    this check was run, for the bundle's README. crash_folder: where a runtime in a worker process
    (a spec with a release or an interpreter) that crashes writes its repro bundle, a new folder
    named after it each time (None: nowhere). padding_mask: an input holding a (batch,
    sequence) mask, 1 for a real token and 0 for padding (transformers' attention_mask): outputs
    whose leading axes are its shape are compared only at the real positions, and the report
    says how many elements were left out. tf32 / bf16: allow those precisions where a runtime
    has them (their own rows).
    """
    name = name or type(module).__name__
    inputs = as_inputs(module, example_inputs, name)
    options = RuntimeOptions(
        tuple(runtimes),
        tuple(parse_eps(eps if isinstance(eps, str) else ",".join(eps))),
        tf32=tf32,
        bf16=bf16,
        crash_folder=Path(crash_folder) if crash_folder is not None else None,
    )
    chosen = _runtimes(options, module)
    if not chosen:
        raise UsageError(f"nothing to run: no runtime of {', '.join(runtimes)} runs on {eps}")
    dynamic_axes = dynamic if isinstance(dynamic, dict) else parse_dynamic(dynamic or (), inputs)
    for input_name in dynamic_axes:
        if input_name not in inputs.names:
            raise UsageError(f"dynamic axes: the module has no input {input_name!r}")
    if isolate not in ISOLATE:
        raise UsageError(f"isolate {isolate!r}: one of {', '.join(ISOLATE)}")
    repro_path = Path(repro) if repro is not None else None
    export_dir = Path(out_dir or default_export_dir(name))
    if onnx_model is None:
        require_own_export_folder(export_dir)  # before anything slow runs

    progress(f"{name}: running the module in eager mode")
    own_inputs = inputs.converted(None, module_device(module))
    own = _run_eagerly(module, own_inputs, name)
    output_names = [n for n, _ in own]
    tols = Tolerances(tuple(output_names), atol, rtol, tuple((tolerances or {}).items()))
    progress(f"{name}: running its float64 copy")
    own_outputs = {n: t.detach().cpu().numpy() for n, t in own if t.is_floating_point()}
    float64_copy = build_float64_copy(module, inputs, name, own_outputs)
    del own, own_outputs
    trim()  # the copy itself is gone (its outputs and captured calls are kept)

    if onnx_model is not None:
        model = given_file(Path(onnx_model))
        ran, why = None, ""
    else:
        path = export_dir / "model.onnx"
        ran, why = _export(
            module, own_inputs, output_names, path, exporter, opset, dynamic_axes, name, progress
        )
        model = given_file(path, origin="exported")
        if why:
            model = replace(model, notes=(why,))

    cls = type(module)
    component = f"{cls.__module__}.{cls.__qualname__}"
    target = ModuleTarget(
        lambda: module,
        args=inputs.arg_names,
        kwargs=tuple(inputs.kwargs),
        floats=frozenset(n for n, t in inputs.named().items() if t.is_floating_point()),
        outputs=tuple(output_names),
    )
    subject = Subject(model, target)
    feeds = inputs.feeds()
    expected = InputSet(input_set, feeds, float64_copy.outputs)
    judge = judge_outputs(lambda precision, output: tols.by_output(precision)[output], padding_mask)
    if padding_mask is not None and padding_mask not in feeds:
        raise UsageError(
            f"--padding-mask {padding_mask}: the module has no input of that name (its inputs: "
            f"{', '.join(feeds)})"
        )
    keep = None if padding_mask is None else np.asarray(feeds[padding_mask]) != 0
    row = Result.about(name, component, notes=list(float64_copy.notes), reference=float64_copy.kind)
    results: list[Result] = []
    localisations: list[Localisation] = []
    located: list[tuple[str, str, Localisation]] = []
    for runtime in chosen:
        what = model.path if runtime.consumes == "onnx" else "the module"
        progress(f"{name}: running {what} on {label(runtime)}")
        (result,) = execute(runtime, subject, [expected], judge, row)
        trim()  # the session is gone
        if padding_mask is not None and result.outputs:
            left_out = sum(o.excluded for o in result.outputs)
            total = sum(int(np.prod(o.shape)) for o in result.outputs)
            result.notes.append(
                f"--padding-mask {padding_mask}: {left_out} of {total} output elements left out "
                "(padded positions)"
            )
        results.append(result)
        wanted = localise or (localise is None and result.status == "fail")
        if runtime.consumes == "onnx" and result.status in ("pass", "fail") and wanted:
            progress(f"{name}: localising on {label(runtime)}")
            tol = tols.module(result.precision)
            loc = _localise(
                result, model, float64_copy, feeds, runtime, tol, isolate, repro_path, command, keep
            )
            localisations += [loc] if loc else []
            located += [(runtime.name, runtime.ep, loc)] if loc else []
    partings = version_partings(located)
    bundles = {loc.repro for loc in localisations if loc.repro}
    if partings and bundles:  # the bundle runs on each version the check compared
        interpreters = {label(r): str(_interpreter(r)) for r in chosen if r.consumes == "onnx"}
        for bundle in bundles:
            add_version_runs(Path(bundle), interpreters)

    settings = {
        "module": name,
        "class": component,
        "input_set": input_set,
        "inputs": {
            n: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
            for n, t in inputs.named().items()
        },
        "outputs": output_names,
        "model": str(model.path),
        "exporter": ran,
        "exporter_asked": None if onnx_model is not None else exporter,
        "exporter_reason": why or None,
        "opset": None if onnx_model is not None else opset,
        "dynamic": {n: {str(a): d for a, d in axes.items()} for n, axes in dynamic_axes.items()},
        "reference": float64_copy.kind,
        "padding_mask": padding_mask,
        "reference_model": float64_copy.provenance.to_dict(),
        # the row of TOLERANCES and the user's overrides; each output's atol/rtol is in results
        "tolerance": {
            "class": DEFAULT_TOLERANCE_CLASS,
            "atol": atol,
            "rtol": rtol,
            "per_output": {n: list(t) for n, t in tols.per_output},
        },
        "eps": list(options.eps),
        "runtimes": {label(r): r.settings() for r in chosen},
    }
    if allow_missing_ep:
        allow_missing(results)
    details: dict[str, object] = {"localisation": [loc.to_dict() for loc in localisations]}
    if partings:
        details["version_partings"] = [p.to_dict() for p in partings]
    return Report(
        results=results,
        settings=settings,
        localisations=localisations,
        partings=partings,
        details=details,
    )


def _interpreter(runtime: Runtime) -> str:
    """The Python a runtime runs in: its worker's environment, or this one."""
    environment = getattr(runtime, "environment", None)
    return str(environment.python) if environment is not None else sys.executable
