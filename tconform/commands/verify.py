"""`tconform verify`: every model on every golden input set, per runtime, with a verdict."""

from __future__ import annotations

from pathlib import Path

import click

from tconform.commands.options import (
    CommaList,
    FolderPath,
    artifacts_option,
    attention_option,
    case_option,
    crash_folder_beside,
    generation_golden_option,
    quiet_option,
    report_options,
    require_reports_apart,
    runtime_options,
    shard_option,
)
from tconform.commands.run import run_and_report, writes_report


def _export():
    import tconform.export

    return tconform.export


def _providers():
    import tconform.runtimes.providers

    return tconform.runtimes.providers


# The matrix axes (VerifyOptions field -> its comma-list type), shared with the pytest plugin.
MATRIX_AXES = {
    "exporters": CommaList(lambda: _export().EXPORTERS),
    "opsets": CommaList(lambda: _export().OPSETS, int),
    "dtypes": CommaList(lambda: list(_export().DTYPES)),
    "graph_opts": CommaList(lambda: list(_providers().GRAPH_OPT_LEVELS)),
}
# option -> (parameter, what the axis is, its value without --matrix). The graph-optimisation
# axis is --graph-opts, a list; --graph-opt (the runtime group's) is the one level of a run.
_AXIS_OPTIONS = {
    "--exporter": ("exporters", "exporters", "dynamo"),
    "--opset": ("opsets", "ONNX opsets", "18"),
    "--dtype": ("dtypes", "model dtypes", "float32"),
    "--graph-opts": ("graph_opts", "ONNX Runtime graph-optimisation levels", "all"),
}


def matrix_axis_options(command):
    for flag, (name, what, default) in reversed(_AXIS_OPTIONS.items()):
        command = click.option(
            flag,
            name,
            type=MATRIX_AXES[name],
            help=f"Matrix axis: {what}, a comma list [{default}].",
        )(command)
    return command


@writes_report("verify")
@click.command("verify")
@click.option(
    "--golden",
    "golden_dir",
    type=FolderPath(),
    default=Path("golden"),
    show_default=True,
)
@artifacts_option("Models; missing or stale ones of tconform's own are exported first.")
@case_option()
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="CASE=PATH",
    help="Verify the ONNX file PATH as CASE (repeatable); read-only, never exported over. "
    "Without --case, only the given cases are checked.",
)
@click.option(
    "--no-export",
    is_flag=True,
    help="Verify exactly what --artifacts holds; export nothing (a missing model is an error; "
    "the document checks, which need their own exports, are left out).",
)
@attention_option("[the --artifacts folder's own; plain for a new folder]")
@runtime_options(
    "runtime", "ep", "tf32", "bf16", "device_id", "provider_option", "graph_opt", "threads",
    "allow_missing_ep", "strict_placement", "no_torch",
)  # fmt: skip
@click.option(
    "--localise",
    "--localize",
    is_flag=True,
    help="On a failure, name the first submodule whose output leaves tolerance (docs/check.md).",
)
@click.option("--no-doc", is_flag=True, help="Skip the documents' checks.")
@click.option(
    "--generation",
    is_flag=True,
    help="Check autoregressive decoding instead: every generation golden on every runtime, with "
    "and without the key/value cache (docs/generation.md).",
)
@generation_golden_option()
@shard_option()
@click.option(
    "--matrix",
    is_flag=True,
    help="Verify every cell of the axes below (each export cell once, under "
    "ARTIFACTS/matrix/<cell>/), with a pivot of cases x cells; impossible cells are listed as "
    "not applicable, with the reason.",
)
@matrix_axis_options
@report_options("json", "junit", "markdown", "plot")
@quiet_option()
def verify(
    golden_dir,
    artifacts_dir,
    cases,
    models,
    no_export,
    attention,
    runtime,
    localise,
    no_doc,
    generation,
    golden_generation_dir,
    shard,
    matrix,
    exporters,
    opsets,
    dtypes,
    graph_opts,
    reports,
    quiet,
) -> None:
    """Run every case on every golden input set and compare within tolerance.

    Exit 0 all passed, 1 a conformance failure, 2 usage or input error, 3 a requested provider
    could not run (unless --allow-missing-ep).
    """
    from tconform.models import parse_model_options
    from tconform.report import RunReport
    from tconform.verify import VerifyOptions
    from tconform.verify import verify as run_verify

    axes = {"exporters": exporters, "opsets": opsets, "dtypes": dtypes, "graph_opts": graph_opts}
    given = {name: values for name, values in axes.items() if values}
    if given and not matrix:
        flag = next(f for f, (name, _, _) in _AXIS_OPTIONS.items() if name in given)
        raise click.UsageError(f"{flag} is a matrix axis: add --matrix")
    if "graph_opts" in given and runtime.graph_opt != "all":
        raise click.UsageError("--graph-opt is one level, --graph-opts the matrix axis: not both")
    given.setdefault("graph_opts", (runtime.graph_opt,))
    if generation and (matrix or shard):
        raise click.UsageError("--generation runs on its own: not with --matrix or --shard")
    model_paths = [item.partition("=")[2].strip() for item in models]
    require_reports_apart(
        [m for m in model_paths if m], *reports.values(), what="the model under test"
    )
    if generation and cases:
        raise click.UsageError(
            "--case selects components; --generation checks every generation golden (name its "
            "models gen_encoder, gen_step, gen_prefix with --model)"
        )

    if generation:
        from tconform.registry import generation_case as lookup
    else:
        from tconform.registry import get_case as lookup

    def run(report, progress) -> None:
        options = VerifyOptions(
            golden_dir=golden_dir,
            artifacts_dir=artifacts_dir,
            runtimes=runtime.options(crash_folder_beside(*reports.values())),
            cases=cases,
            allow_missing_ep=runtime.allow_missing_ep,
            strict_placement=runtime.strict_placement,
            with_doc=not no_doc,
            models=parse_model_options(models, lookup),
            export=not no_export,
            localise=localise,
            attention=attention,
            shard=shard,
            matrix=matrix,
            **given,
        )
        if generation:
            from tconform.generation.verify import verify_generation

            verify_generation(options, golden_generation_dir, report, progress)
        else:
            run_verify(options, report, progress)

    render = None
    if matrix:
        from tconform.report.pivot import render_with_pivot

        def render(report) -> str:
            if not report.results:
                return ""
            parts = [render_with_pivot(report.results), report.versions_text()]
            return "\n\n".join(part for part in parts if part)

    run_and_report(RunReport("verify"), run, quiet, reports, render=render)
