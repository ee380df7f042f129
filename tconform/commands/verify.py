"""`tconform verify`: every model on every golden input set, per runtime, with a verdict."""

from __future__ import annotations

from pathlib import Path

import click

from tconform.models import parse_model_options
from tconform.report import json_report, junit, markdown, plot, table
from tconform.runtimes.onnxruntime import parse_eps, parse_provider_options
from tconform.verify import VerifyOptions
from tconform.verify import verify as run_verify


@click.command("verify")
@click.option(
    "--golden",
    "golden_dir",
    type=click.Path(path_type=Path),
    default=Path("golden"),
    show_default=True,
)
@click.option(
    "--artifacts",
    "artifacts_dir",
    type=click.Path(path_type=Path),
    default=Path("artifacts"),
    show_default=True,
    help="Models; missing ones are exported first.",
)
@click.option(
    "--ep",
    "ep_spec",
    default="cpu",
    show_default=True,
    help="Execution providers: cpu, cuda, a comma list, or all.",
)
@click.option("--case", "cases", multiple=True, help="Only this case (repeatable).")
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
@click.option(
    "--allow-missing-ep",
    is_flag=True,
    help="Report a provider that cannot run as skipped instead of exiting 3.",
)
@click.option(
    "--strict-placement",
    is_flag=True,
    help="Fail a result when nodes fell back from the requested provider to the CPU.",
)
@click.option("--tf32", is_flag=True, help="Allow TF32 matrix products on CUDA (own tolerance).")
@click.option("--device-id", type=int, default=0, show_default=True, help="CUDA device.")
@click.option(
    "--provider-option",
    "provider_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Passed to the provider (repeatable), e.g. cudnn_conv_algo_search=DEFAULT.",
)
@click.option("--no-torch", is_flag=True, help="Skip the PyTorch float32 rows.")
@click.option("--no-doc", is_flag=True, help="Skip the documents' checks.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the JSON report.")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path), help="Write JUnit XML.")
@click.option(
    "--markdown", "markdown_path", type=click.Path(path_type=Path), help="Write a markdown summary."
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(path_type=Path),
    help="Write a PNG of the error distribution.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
def verify(
    golden_dir,
    artifacts_dir,
    ep_spec,
    cases,
    models,
    no_export,
    allow_missing_ep,
    strict_placement,
    tf32,
    device_id,
    provider_options,
    no_torch,
    no_doc,
    json_path,
    junit_path,
    markdown_path,
    plot_path,
    quiet,
) -> None:
    """Run every case on every golden input set and compare within tolerance.

    Exit 0 all passed, 1 a conformance failure, 2 usage or input error, 3 a requested provider
    could not run (unless --allow-missing-ep).
    """
    options = VerifyOptions(
        golden_dir=golden_dir,
        artifacts_dir=artifacts_dir,
        eps=parse_eps(ep_spec),
        cases=cases,
        allow_missing_ep=allow_missing_ep,
        strict_placement=strict_placement,
        tf32=tf32,
        device_id=device_id,
        provider_options=parse_provider_options(list(provider_options)),
        with_torch=not no_torch,
        with_doc=not no_doc,
        models=parse_model_options(models),
        export=not no_export,
    )
    progress = (lambda _: None) if quiet else (lambda line: click.echo(line, err=True))
    run = run_verify(options, progress)
    click.echo(table.render(run.results))
    if json_path:
        json_report.write(json_path, run.results, run.settings)
    if junit_path:
        junit.write(junit_path, run.results)
    if markdown_path:
        markdown.write(markdown_path, run.results)
    if plot_path:
        plot.write(plot_path, run.results)
    click.echo(table.summary(run.results))
    raise SystemExit(run.exit_code)
