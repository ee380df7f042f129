"""`tconform check PACKAGE.MODULE:FACTORY`: your own module, exported, run on each provider and
judged against its own float64 copy (tconform.check does the work; docs/check.md)."""

from __future__ import annotations

from pathlib import Path

import click

from tconform.commands.options import (
    allow_missing_ep_option,
    ep_option,
    quiet_option,
    report_options,
    require_reports_apart,
)
from tconform.commands.run import run_and_report, writes_run_report


def _provenance(report) -> str:
    from tconform.runtimes.labels import runtime_label

    lines = ["provenance:"]
    for r in report.results:
        if r.model is not None:
            lines.append(f"  {runtime_label(r.runtime, r.ep, r.precision)}: {r.model.short}")
    ref = report.settings["reference_model"]
    lines.append(
        f"  reference: {ref['path']} ({ref['origin']}, {report.settings['reference']}, "
        f"sha256 {ref['sha256'][:12]})"
    )
    return "\n".join(dict.fromkeys(lines))


@writes_run_report("check")
@click.command("check")
@click.argument("target", metavar="PACKAGE.MODULE:FACTORY")
@click.option(
    "--inputs",
    "inputs_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Inputs (.npz: arrays named after forward's parameters, or arr_0, arr_1, ...).",
)
@click.option(
    "--dynamic",
    multiple=True,
    metavar="NAME=AXES",
    help="Dynamic axes of an input, e.g. ids=0:batch,1:seq (repeatable).",
)
@ep_option()
@allow_missing_ep_option()
@click.option("--tf32", is_flag=True, help="Allow TF32 matrix products on CUDA (own tolerance).")
@click.option(
    "--exporter", type=click.Choice(["dynamo", "torchscript"]), default="dynamo", show_default=True
)
@click.option("--opset", type=click.IntRange(17, 23), default=18, show_default=True)
@click.option("--atol", type=click.FloatRange(min=0), help="Absolute tolerance [float32 model].")
@click.option("--rtol", type=click.FloatRange(min=0), help="Relative tolerance [float32 model].")
@click.option(
    "--tolerance",
    "per_output",
    multiple=True,
    metavar="OUTPUT=ATOL,RTOL",
    help="Tolerance for one output (repeatable).",
)
@click.option(
    "--model",
    "model_path",
    type=click.Path(path_type=Path),
    help="Check this ONNX file (made elsewhere, never modified) instead of exporting.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Folder for the exported model and export.log [artifacts/check/TARGET].",
)
@click.option(
    "--localise",
    "--localize",
    "localise_all",
    is_flag=True,
    help="Localise on every provider, not only where an output fails.",
)
@click.option("--no-torch", is_flag=True, help="Skip the PyTorch float32 row.")
@report_options("json", "junit", "markdown")
@quiet_option()
def check(
    target,
    inputs_path,
    dynamic,
    ep_spec,
    allow_missing_ep,
    tf32,
    exporter,
    opset,
    atol,
    rtol,
    per_output,
    model_path,
    out_dir,
    localise_all,
    no_torch,
    json_path,
    junit_path,
    markdown_path,
    quiet,
) -> None:
    """Check your own module: FACTORY (in PACKAGE.MODULE, importable from the current folder)
    returns (module, example_inputs), or the module alone with --inputs. The module is exported
    (or --model is taken), run on each provider and compared with its own float64 copy; on a
    failure, or with --localise, the first submodule that diverges is named.

    Exit 0 all passed, 1 a conformance failure, 2 usage, input or export error, 3 a requested
    provider could not run (unless --allow-missing-ep).
    """
    from tconform.errors import UsageError
    from tconform.localise import render
    from tconform.module_check import check as run_check
    from tconform.module_check.exporting import OWN_FILES, OWN_RECORD, default_export_dir
    from tconform.module_check.inputs import load_factory, read_npz
    from tconform.module_check.run import parse_tolerance
    from tconform.report import table

    folder = out_dir or default_export_dir(target)
    kept = [model_path] if model_path else [folder / n for n in (*OWN_FILES, OWN_RECORD)]
    require_reports_apart(
        kept, json_path, junit_path, markdown_path, what="a file tconform check reads or keeps"
    )

    def run(report, progress) -> None:
        tolerances = parse_tolerance(per_output)
        module, example_inputs = load_factory(target)
        if inputs_path is not None:
            example_inputs = read_npz(inputs_path, module)
        elif example_inputs is None:
            raise UsageError(
                f"{target}: the factory returned only a module; pass --inputs FILE.npz"
            )
        checked = run_check(
            module,
            example_inputs,
            eps=ep_spec,
            exporter=exporter,
            opset=opset,
            dynamic=list(dynamic),
            atol=atol,
            rtol=rtol,
            tolerances=tolerances,
            onnx_model=model_path,
            out_dir=folder,
            localise=True if localise_all else None,
            runtimes=("onnxruntime",) if no_torch else ("onnxruntime", "torch"),
            allow_missing_ep=allow_missing_ep,
            tf32=tf32,
            name=target,
            input_set=inputs_path.name if inputs_path else "example",
            progress=progress,
        )
        report.results, report.settings, report.details = (
            checked.results,
            checked.settings,
            checked.details,
        )
        texts.extend(render(loc) for loc in checked.localisations)
        texts.append(_provenance(checked))

    texts: list[str] = []

    def render_all(results) -> str:
        return "\n\n".join([table.render(results), *texts])

    run_and_report("check", run, quiet, json_path, junit_path, markdown_path, render=render_all)
