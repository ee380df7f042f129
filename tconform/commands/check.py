"""`tconform check PACKAGE.MODULE:FACTORY`: your own module, exported, run on each runtime and
provider and judged against its own float64 copy (tconform.check does the work; docs/check.md).

The user's code (importing the factory, the factory, forward, the export, the reference, the
whole check) runs in a child process (tconform.child): whatever it does (`sys.exit(0)`,
`os._exit(0)`, a segmentation fault, the kernel's out-of-memory killer) ends the command with
one line, exit 2 and the requested reports, never with exit 0 for a check that checked nothing.
Everything that can be refused without running it is refused here first, in this process: the
options' values, `--model` and `--inputs` (regular files, before anything opens them), the
`--out` folder and the report paths.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from tconform.commands.options import (
    FolderPath,
    RegularFile,
    crash_folder_beside,
    quiet_option,
    report_options,
    require_reports_apart,
    runtime_options,
    tolerance_options,
)
from tconform.commands.run import run_and_report, writes_report


def _provenance(results, settings) -> str:
    from tconform.runtimes.labels import runtime_label

    lines = ["provenance:"]
    for r in results:
        if r.model is not None:
            lines.append(f"  {runtime_label(r.runtime, r.ep, r.precision)}: {r.model.short}")
    ref = settings["reference_model"]
    lines.append(
        f"  reference: {ref['path']} ({ref['origin']}, {settings['reference']}, "
        f"sha256 {ref['sha256'][:12]})"
    )
    return "\n".join(dict.fromkeys(lines))


@writes_report("check")
@click.command("check")
@click.argument("target", metavar="PACKAGE.MODULE:FACTORY")
@click.option(
    "--inputs",
    "inputs_path",
    type=RegularFile(),
    help="Inputs (.npz: arrays named after forward's parameters, or arr_0, arr_1, ...).",
)
@click.option(
    "--dynamic",
    multiple=True,
    metavar="NAME=AXES",
    help="Dynamic axes of an input, e.g. ids=0:batch,1:seq (repeatable).",
)
@runtime_options("runtime", "ep", "tf32", "bf16", "allow_missing_ep", "no_torch")
@click.option(
    "--exporter",
    type=click.Choice(["auto", "dynamo", "torchscript"]),
    default="auto",
    show_default=True,
    help="auto: dynamo, then TorchScript where dynamo fails (the report says which ran, and why).",
)
@click.option("--opset", type=click.IntRange(17, 23), default=18, show_default=True)
@tolerance_options()
@click.option(
    "--model",
    "model_path",
    type=RegularFile(),
    help="Check this ONNX file (made elsewhere, never modified) instead of exporting.",
)
@click.option(
    "--out",
    "out_dir",
    type=FolderPath(),
    help="Folder for the exported model and export.log [artifacts/check/TARGET].",
)
@click.option(
    "--localise",
    "--localize",
    "localise_all",
    is_flag=True,
    help="Localise on every provider, not only where an output fails.",
)
@click.option(
    "--isolate",
    type=click.Choice(["first", "all", "none"]),
    default="first",
    show_default=True,
    help="Modules cut out of the model and run on the float64 copy's inputs, for their own "
    "error beside the cumulative one: the first divergence, every module, or none.",
)
@click.option(
    "--repro",
    "repro_dir",
    type=FolderPath(),
    help="Write the first divergence's bundle here: its subgraph, inputs and expected outputs "
    "in the ONNX test-data layout, reproduce.py (plain onnxruntime) and a README.",
)
@click.option(
    "--padding-mask",
    metavar="INPUT",
    help="An input holding a (batch, sequence) mask, 1 = real token, 0 = padding "
    "(attention_mask): outputs whose leading axes are its shape are compared at real positions "
    "only; the report says how many elements were left out.",
)
@report_options("json", "junit", "markdown")
@quiet_option()
def check(
    target,
    inputs_path,
    dynamic,
    runtime,
    exporter,
    opset,
    tolerance,
    model_path,
    out_dir,
    localise_all,
    isolate,
    repro_dir,
    padding_mask,
    reports,
    quiet,
) -> None:
    """Check your own module: FACTORY (in PACKAGE.MODULE, importable from the current folder)
    returns (module, example_inputs), or the module alone with --inputs. The module is exported
    (or --model is taken), run on each runtime and provider and compared with its own float64
    copy; on a failure, or with --localise, the first submodule that diverges is named.

    Exit 0 all passed, 1 a conformance failure, 2 usage, input or export error (also when the
    module's code ends the check's process), 3 a requested provider could not run (unless
    --allow-missing-ep).
    """
    from tconform.check_folder import (
        OWN_FILES,
        OWN_RECORD,
        default_export_dir,
        require_own_export_folder,
    )
    from tconform.child import run_in_child
    from tconform.report import RunReport, table
    from tconform.report.environment import utc_now

    folder = out_dir or default_export_dir(target)
    kept = [model_path] if model_path else [folder / n for n in (*OWN_FILES, OWN_RECORD)]
    require_reports_apart(kept, *reports.values(), what="a file tconform check reads or keeps")
    texts: list[str] = []

    def run(report, progress) -> None:
        eps = runtime.options().eps  # --ep is checked here, before the child starts
        if model_path is None:
            require_own_export_folder(folder)
        settings = {
            "eps": ",".join(eps),
            "runtimes": runtime.names,
            "exporter": exporter,
            "opset": opset,
            "dynamic": list(dynamic),
            "atol": tolerance.atol,
            "rtol": tolerance.rtol,
            "tolerances": dict(tolerance.per_output),
            "onnx_model": model_path,
            "out_dir": folder,
            "localise": True if localise_all else None,
            "allow_missing_ep": runtime.allow_missing_ep,
            "tf32": runtime.tf32,
            "bf16": runtime.bf16,
            "name": target,
            "input_set": inputs_path.name if inputs_path else "example",
            "isolate": isolate,
            "repro": repro_dir,
            "crash_folder": crash_folder_beside(repro_dir, *reports.values()),
            "padding_mask": padding_mask,
            "command": shlex.join(["tconform", *sys.argv[1:]]),
        }
        phase = ["starting"]

        def on_message(message) -> None:
            if not (isinstance(message, tuple) and len(message) == 2):
                return
            kind, text = (str(part) for part in message)
            phase[0] = text.removeprefix(f"{target}: ")
            if kind == "progress":
                progress(text)

        def ended_early(how: str) -> str:
            return (
                f"{target}: the check's process {how} while {phase[0]}, before it finished; "
                "nothing was checked"
            )

        started = utc_now()
        found = run_in_child(
            check_in_child, (target, inputs_path, settings, started), on_message, target,
            ended_early,
        )  # fmt: skip
        report.results, report.settings = found["results"], found["settings"]
        report.details, report.environment = found["details"], found["environment"]
        texts.extend(found["texts"])

    def render(report) -> str:
        if not report.results:
            return ""
        parts = [table.render(report.results), *texts, report.versions_text()]
        return "\n\n".join(part for part in parts if part)

    run_and_report(RunReport("check"), run, quiet, reports, render=render)


def check_in_child(
    send, target: str, inputs_path: Path | None, settings: dict, started: str
) -> dict:
    """In the check's process: the factory, its inputs and the whole check; what the report
    needs comes back (results, settings, details, the rendered localisations and the
    environment block, taken here, where torch is loaded anyway)."""
    from tconform.errors import UsageError
    from tconform.localise import render
    from tconform.module_check import check as run_check
    from tconform.module_check.inputs import load_factory, read_npz
    from tconform.report.environment import environment

    send(("phase", f"importing {target.partition(':')[0]!r} and calling the factory"))
    module, example_inputs = load_factory(target)
    if inputs_path is not None:
        send(("phase", f"reading {inputs_path}"))
        example_inputs = read_npz(inputs_path, module)
    elif example_inputs is None:
        raise UsageError(f"{target}: the factory returned only a module; pass --inputs FILE.npz")
    checked = run_check(
        module,
        example_inputs,
        progress=lambda line: send(("progress", line)),
        **settings,
    )
    send(("phase", "sending the results"))
    return {
        # As JSON holds them: plain values, which the parent reads back without torch (the
        # environment's torch version is torch's own str type, say).
        **_plain(
            {
                "environment": environment(started),
                "settings": checked.settings,
                "details": checked.details,
            }
        ),
        "results": checked.results,
        "texts": [
            *(render(loc) for loc in checked.localisations),
            *(f"versions: {parting.verdict}" for parting in checked.partings),
            _provenance(checked.results, checked.settings),
        ],
    }


def _plain(data: dict) -> dict:
    """`data` as JSON would read it back (what the reports hold anyway)."""
    import json

    from tconform.report.json_report import strict

    return json.loads(json.dumps(strict(data), default=str))
