"""`tconform verify`: every model on every golden input set, per runtime, with a verdict."""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from tconform.commands.options import (
    AXIS_OPTIONS,
    FolderPath,
    RuntimeCommand,
    artifacts_option,
    attention_option,
    axes_options,
    case_option,
    crash_folder_beside,
    generation_golden_option,
    localise_option,
    quiet_option,
    report_options,
    require_reports_apart,
    runtime_options,
    shard_option,
)
from tconform.commands.run import run_and_report, writes_report


@writes_report("verify")
@click.command("verify", cls=RuntimeCommand)
@click.option(
    "--golden",
    "golden_dir",
    type=FolderPath(),
    default=Path("golden"),
    show_default=True,
)
@artifacts_option("Models; missing or stale ones of tconform's own are exported first.")
@case_option("Only this case, or with --generation this golden (repeatable).")
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
@runtime_options("runtime", "ep", "threads", "allow_missing_ep", "strict_placement", "no_torch")
@localise_option("never", "never")
@click.option("--no-doc", is_flag=True, help="Skip the documents' checks.")
@click.option(
    "--generation",
    is_flag=True,
    help="Check autoregressive decoding instead: every generation golden on every runtime, with "
    "and without the key/value cache (docs/generation.md).",
)
@generation_golden_option()
@shard_option()
@axes_options(
    "the artifacts folder's own; {} for a new one",
    exporters="dynamo", opsets="18", dtypes="float32", graph_opts="all",
)  # fmt: skip
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
    axes,
    reports,
    quiet,
) -> None:
    """Run every case on every golden input set and compare within tolerance.

    Exit 0 all passed, 1 a conformance failure, 2 usage or input error, 3 a requested provider
    could not run (unless --allow-missing-ep) or nothing was checked (every result skipped, or
    every ONNX row: the torch rows check the reference module, not a model).
    """
    from tconform.models import parse_model_options
    from tconform.pipeline import run_request
    from tconform.report import RunReport
    from tconform.request import Generations, Localising, References, Request

    _refuse_conflicts(axes, generation, attention)
    model_paths = [item.partition("=")[2].strip() for item in models]
    require_reports_apart(
        [m for m in model_paths if m], *reports.values(), what="the model under test"
    )

    def run(report, progress) -> None:
        if generation:
            given = parse_model_options(models, _generation_case())
            subject = Generations(
                golden_generation_dir, artifacts_dir, cases, given, export=not no_export
            )
        else:
            subject = References(
                golden_dir, artifacts_dir, cases, parse_model_options(models, _component_case()),
                export=not no_export, attention=attention, with_doc=not no_doc,
            )  # fmt: skip
        request = Request(
            subject, **runtime.request_fields(crash_folder_beside(*reports.values())),
            axes=axes.axes(runtime), localise=Localising(localise), shard=shard,
        )  # fmt: skip
        run_request(request, report, progress)

    run_and_report(RunReport("verify"), run, quiet, reports)


def _refuse_conflicts(axes, generation: bool, attention: str | None) -> None:
    if axes.given and not axes.matrix:  # a plain run's one cell is the artifacts folder's own
        flag = next(f for f, (name, _) in AXIS_OPTIONS.items() if name in dict(axes.given))
        raise click.UsageError(f"{flag} is a matrix axis: add --matrix")
    if generation and attention:
        raise click.UsageError(
            "--attention picks the kernel of the cases' models; --generation's are plain"
        )
    given = click.get_current_context().get_parameter_source
    typed = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    if generation and given("golden_dir") in typed:  # it would be ignored without a word
        raise click.UsageError(
            "--golden names the cases' goldens; --generation reads --golden-generation DIR"
        )
    if not generation and given("golden_generation_dir") in typed:
        raise click.UsageError("--golden-generation is read with --generation only")


def _component_case():
    from tconform.registry import get_case

    return get_case


def _generation_case():
    from tconform.registry import generation_case

    return generation_case
