"""The Python API: `tconform.check` and `tconform.verify`, each a Request (tconform.request) run
through the one pipeline (tconform.pipeline), as the command line's `check` and `verify` are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from torch import nn

from tconform.errors import EXIT_EP_UNAVAILABLE, UsageError
from tconform.pipeline import run, run_request
from tconform.report import RunReport
from tconform.request import (
    Axes,
    Generations,
    Localising,
    References,
    Request,
    Tolerances,
    UserModel,
)
from tconform.runtimes import RuntimeOptions, declared_settings, require_taken
from tconform.runtimes.providers import parse_eps
from tconform.suites.module import AUTO, ModuleSuite
from tconform.units import unchecked

Progress = Callable[[str], None]


def _localise_when(localise: bool | None) -> str:
    return {True: "always", None: "failure", False: "never"}[localise]


def check(
    module: nn.Module,
    example_inputs: object,
    *,
    eps: Sequence[str] | str = ("cpu",),
    runtimes: Sequence[str] = ("onnxruntime", "torch"),
    exporter: str = AUTO,
    opset: int = Axes.opsets[0],
    dtype: str = "float32",
    matrix: Axes | None = None,
    dynamic: Mapping[str, Mapping[int, str]] | Sequence[str] | None = None,
    shapes: bool = True,
    atol: float | None = None,
    rtol: float | None = None,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    onnx_model: str | Path | None = None,
    out_dir: str | Path | None = None,
    localise: bool | None = None,
    isolate: str = "first",
    repro: str | Path | None = None,
    padding_mask: str | None = None,
    allow_missing_ep: bool = False,
    strict_placement: bool = False,
    threads: int = 0,
    runtime_options: Mapping[str, object] | None = None,
    name: str | None = None,
    command: str = "",
    crash_folder: str | Path | None = None,
    shard: tuple[int, int] | None = None,
    progress: Progress = lambda _: None,
) -> RunReport:
    """Check `module` called with `example_inputs` (a tensor, a tuple of tensors, or a dict of
    keyword tensors) against its own float64 copy, on each runtime and provider, as `tconform
    check` does (docs/check.md).

    eps: providers ("cpu", "cuda", a spec such as "cpu,cuda" or "all"). runtimes: names in
    tconform.runtimes.RUNTIMES, or specs naming a release or an interpreter of one
    ("onnxruntime==1.20.1", "openvino@/usr/bin/python3.11": tconform.runtimes.specs), each such
    run in a worker process; the ONNX ones run the exported (or given) model, the module ones
    (torch) the module itself. threads: intra-op threads (0: each runtime's default).
    runtime_options: the options runtimes declare, by field, as the command line's options set
    them ({"tf32": True, "graph_opt": "basic", "bf16": True, "device_id": 1,
    "provider_options": {...}}: tconform.runtimes.declared_options()).
    exporter/opset/dtype: the export's one cell; matrix: an Axes whose every cell is checked
    instead. dynamic: axes kept free, {input: {axis: name}} or
    ["NAME=AXES", ...] as on the command line (the others inferred); shapes: also check at batch
    1, a larger batch, a shorter and a longer sequence, with batch consistency. atol/rtol:
    override the default (the "model" row of tconform.compare.TOLERANCES); tolerances: per
    output, {output: (atol, rtol)}. onnx_model: an ONNX file made elsewhere, checked instead of
    exporting (read-only). out_dir: where the exports go (default artifacts/check/<name>).
    localise: True on every ONNX runtime, None (default) where an output fails, False never;
    isolate: "first", "all" or "none"; repro: a folder for the first divergence's bundle.
    padding_mask: an input holding a (batch, sequence) mask, 1 for a real token: outputs led by
    its shape are compared at the real positions only. crash_folder: where a runtime in a
    worker process that crashes writes its repro bundle, a new folder named after it each time
    (None: nowhere). shard: (K, N), this machine's share of the check's work units, as
    verify's (`report merge` makes the shards' JSON reports one). Returns the run's report
    (`exit_code`, `results`, `localisations`, and `partings`: where two localised versions of
    a runtime part)."""
    declared = dict(dynamic) if isinstance(dynamic, Mapping) else {}
    given = tuple(dynamic) if dynamic is not None and not isinstance(dynamic, Mapping) else ()
    request = Request(
        UserModel(
            target=name or type(module).__name__,
            dynamic=given,
            model=Path(onnx_model) if onnx_model is not None else None,
            out_dir=Path(out_dir) if out_dir is not None else None,
            padding_mask=padding_mask,
            shapes=shapes,
        ),
        runtimes=_runtimes(runtimes, eps, threads, runtime_options, crash_folder),
        allow_missing_ep=allow_missing_ep,
        strict_placement=strict_placement,
        axes=_at_level(
            matrix or Axes(exporters=(exporter,), opsets=(opset,), dtypes=(dtype,)),
            runtime_options,
        ),
        tolerances=Tolerances(atol, rtol, tuple((tolerances or {}).items())),
        localise=Localising(_localise_when(localise), isolate, Path(repro) if repro else None),
        shard=shard,
        command=command,
    )
    report = RunReport("check")
    suite = ModuleSuite(request, module, example_inputs, progress, declared)
    run(request, suite, report, progress)
    why = unchecked(report.results, request.whole_run)
    if why:  # exit 3, as the command line's, with the reason
        report.error = {"message": why, "exit_code": EXIT_EP_UNAVAILABLE}
    return report


def verify(
    golden_dir: str | Path | None = None,
    artifacts_dir: str | Path = "artifacts",
    *,
    generation: bool = False,
    cases: Sequence[str] = (),
    eps: Sequence[str] | str = ("cpu",),
    runtimes: Sequence[str] = ("onnxruntime", "torch"),
    matrix: Axes | None = None,
    with_doc: bool = True,
    localise: bool = False,
    allow_missing_ep: bool = False,
    strict_placement: bool = False,
    threads: int = 0,
    runtime_options: Mapping[str, object] | None = None,
    shard: tuple[int, int] | None = None,
    crash_folder: str | Path | None = None,
    progress: Progress = lambda _: None,
) -> RunReport:
    """Verify tconform's own cases against the goldens of `golden_dir` (default "golden"), as
    `tconform verify` does: their models exported to `artifacts_dir` where missing or stale; or
    with `generation`, decode the generation goldens (default "golden-generation") as `verify
    --generation` does. cases: only these cases (or goldens). shard: (K, N), this machine's
    part of the work units (`tconform report merge` joins the reports). The runtime arguments
    are `check`'s. Returns the run's report."""
    runtime_request = _runtimes(runtimes, eps, threads, runtime_options, crash_folder)
    if generation:
        folder = Path(golden_dir or "golden-generation")
        subject = Generations(folder, Path(artifacts_dir), tuple(cases))
    else:
        folder = Path(golden_dir or "golden")
        subject = References(folder, Path(artifacts_dir), tuple(cases), with_doc=with_doc)
    request = Request(
        subject,
        runtimes=runtime_request,
        allow_missing_ep=allow_missing_ep,
        strict_placement=strict_placement,
        axes=_at_level(matrix or Axes(), runtime_options),
        localise=Localising("failure" if localise else "never"),
        shard=shard,
    )
    report = RunReport("verify")
    run_request(request, report, progress)
    return report


def _runtimes(
    names: Sequence[str],
    eps: Sequence[str] | str,
    threads: int,
    options: Mapping[str, object] | None,
    crash_folder: str | Path | None,
) -> RuntimeOptions:
    """The runtimes a call asks for, as the command line's runtime options build them."""
    spec = eps if isinstance(eps, str) else ",".join(eps)
    settings = declared_settings(options or {})
    chosen = tuple(parse_eps(spec))
    require_taken(tuple(names), settings, threads, chosen)
    return RuntimeOptions(
        tuple(names),
        chosen,
        settings=settings,
        threads=threads,
        crash_folder=Path(crash_folder) if crash_folder is not None else None,
    )


def _at_level(axes: Axes, options: Mapping[str, object] | None) -> Axes:
    """`axes` with the one graph-optimisation level `options` give (as the command line's
    --graph-opt stands for the axis): the plan runs each cell at its axis' level."""
    level = (options or {}).get("graph_opt")
    if level is None:
        return axes
    if axes.graph_opts != Axes.graph_opts:
        raise UsageError(
            "runtime_options' graph_opt is one level, the matrix's graph_opts the axis: not both"
        )
    return replace(axes, graph_opts=(str(level),))
