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

import click

from tconform.commands.options import (
    FolderPath,
    RuntimeCommand,
    axes_options,
    crash_folder_beside,
    localise_option,
    module_options,
    quiet_option,
    report_options,
    require_reports_apart,
    require_reports_outside,
    runtime_options,
    shard_option,
    tolerance_options,
)
from tconform.commands.run import run_and_report, writes_report
from tconform.errors import EXIT_FAILURE, TconformError, UsageError, one_line


def _provenance(results, settings) -> str:
    from tconform.runtimes.labels import runtime_label

    lines = ["provenance:"]
    for r in results:
        if r.model is not None:
            lines.append(f"  {runtime_label(r.runtime, r.ep, r.precision)}: {r.model.short}")
    ref = settings.get("reference_model")
    if not ref:
        return "\n".join(dict.fromkeys(one_line(line) for line in lines))
    lines.append(
        f"  reference: {ref['path']} ({ref['origin']}, {settings['reference']}, "
        f"sha256 {ref['sha256'][:12]})"
    )
    return "\n".join(dict.fromkeys(one_line(line) for line in lines))


@writes_report("check")
@click.command("check", cls=RuntimeCommand)
@click.argument("target", metavar="PACKAGE.MODULE:FACTORY")
@module_options("inputs", "dynamic", "model", "padding_mask")
@click.option(
    "--no-shapes",
    is_flag=True,
    help="Check at the example's shape only (not also at batch 1, a larger batch, a shorter and "
    "a longer sequence, nor batch consistency).",
)
@runtime_options("runtime", "ep", "threads", "allow_missing_ep", "strict_placement", "no_torch")
@axes_options("{}", exporters="auto", opsets="18", dtypes="float32", graph_opts="all")
@tolerance_options()
@click.option(
    "--out",
    "out_dir",
    type=FolderPath(),
    help="Folder for the exported models and export.log [artifacts/check/TARGET].",
)
@localise_option("failure", "failure")
@click.option(
    "--isolate",
    type=click.Choice(["first", "all", "none"]),
    default="first",
    show_default=True,
    help="Modules cut out of the model and run on the float64 copy's inputs, which is what "
    "names one: along the error's path until one fails on its own (first), also every other "
    "module, for the table (all), or none (then nothing is named).",
)
@click.option(
    "--repro",
    "repro_dir",
    type=FolderPath(),
    help="Write the first divergence's bundle here: its subgraph, inputs and expected outputs "
    "in the ONNX test-data layout, reproduce.py (plain onnxruntime) and a README.",
)
@shard_option()
@report_options("json", "junit", "markdown", "plot")
@quiet_option()
def check(
    target, module, no_shapes, runtime, axes, tolerance, out_dir, localise, isolate, repro_dir,
    shard, reports, quiet,
) -> None:  # fmt: skip
    """Check your own module: FACTORY (in PACKAGE.MODULE, importable from the current folder)
    returns (module, example_inputs), optionally with its dynamic axes, or the module alone
    with --inputs. The module is exported (or --model is taken), run on each runtime and
    provider, at the example's shape and at shapes it never had, and compared with its own
    float64 copy; on a failure (or as --localise asks) the first submodule that diverges is
    named.

    Exit 0 all passed, 1 a conformance failure, 2 usage, input or export error (also when the
    module's code ends the check's process), 3 a requested provider could not run (unless
    --allow-missing-ep) or nothing was checked (every result skipped, say under an atol blind
    to the outputs, or every ONNX row: the torch rows check the module, not its export).
    """
    from tconform.check_folder import OWN_FILES, OWN_RECORD, export_folder, require_target
    from tconform.report import RunReport

    require_target(target)
    axes.single()
    if module.model:
        axes.given_model()
    folder = export_folder(target, out_dir)
    kept = [module.model] if module.model else [folder / n for n in (*OWN_FILES, OWN_RECORD)]
    require_reports_apart(kept, *reports.values(), what="a file tconform check reads or keeps")
    require_reports_outside(reports, [("--out", folder)])  # the default folder too

    def run(report, progress) -> None:
        from tconform.check_folder import require_own_export_folder, require_repro_folder
        from tconform.request import Localising, Request

        if module.model is None:
            require_own_export_folder(folder)
        if repro_dir is not None:
            read = [module.model or folder, *([module.inputs] if module.inputs else [])]
            require_repro_folder(repro_dir, [*read, *(p for p in reports.values() if p)])

        request = Request(
            module.subject(target, folder, shapes=not no_shapes),
            # --ep is checked here, before the child starts
            **runtime.request_fields(crash_folder_beside(repro_dir, *reports.values())),
            axes=axes.axes(runtime, {"exporters": ("auto",)}),
            tolerances=tolerance,
            localise=Localising(localise, isolate, repro_dir),
            shard=shard,
            command=shlex.join(["tconform", *sys.argv[1:]]),
        )  # fmt: skip
        in_child(request, report, progress)

    run_and_report(RunReport("check"), run, quiet, reports, render=render)


def render(report) -> str:
    """The table, each localisation, the versions of a runtime compared, and where every
    result's model came from."""
    if not report.results:
        return ""
    return "\n\n".join([report.render(), _provenance(report.results, report.settings)])


def in_child(request, report, progress) -> None:
    """The check of `request` in a spawned child (tconform.child): the user's code never ends
    this process; what the report needs comes back."""
    from tconform.child import run_in_child
    from tconform.report.environment import utc_now
    from tconform.units import require_checked

    subject = request.subject
    phase = ["starting"]
    so_far = LanesSoFar()

    def on_message(message) -> None:
        if not (isinstance(message, tuple) and len(message) == 2):
            return
        if so_far.take(message):
            return
        kind, text = (str(part) for part in message)
        phase[0] = text.removeprefix(f"{subject.target}: ")
        if kind == "progress":
            progress(text)

    def ended_early(how: str) -> str:
        so_far.how = how
        return (
            f"{subject.target}: the check's process {how} while {phase[0]}, before it "
            "finished; nothing was checked"
        )

    try:
        found = run_in_child(
            check_in_child, (request, utc_now()), on_message, subject.target, ended_early
        )
    except UsageError:
        if so_far.running is None:  # not while a runtime ran: the module's code, or an export
            raise
        report.results, report.settings = so_far.crashed(subject.target)
        raise TconformError.with_code(report.results[-1].message, EXIT_FAILURE) from None
    report.results, report.settings = found["results"], found["settings"]
    report.details, report.environment = found["details"], found["environment"]
    report.localisations, report.partings = found["localisations"], found["partings"]
    require_checked(report.results, request.whole_run)


class LanesSoFar:
    """What the check's process told of its lanes: the results of those that ended, and the
    one running or being localised. Where the process ends mid-lane (a runtime's native code
    crashing: a segmentation fault in ONNX Runtime's optimiser on a float16 model) or while a
    lane is localised (the runtime on the graph with its boundaries as outputs), that is a
    crash result, and the lanes before keep theirs: exit 1, not "nothing was checked"."""

    def __init__(self) -> None:
        self.results: list = []
        self.settings: dict = {}
        self.running: dict | None = None
        self.how = "ended"

    def take(self, message: tuple) -> bool:
        kind, payload = message
        if kind == "lane":
            self.running, self.settings = payload
        elif kind == "results":
            self.results += payload
            self.running = None
        return kind in ("lane", "results")

    def crashed(self, target: str) -> tuple[list, dict]:
        from tconform.results import Result, Status
        from tconform.runtimes import can_isolate

        lane = self.running
        message = (
            f"{target}: the check's process {self.how} while {lane['label']} {lane['doing']} "
            f"({lane['cell']}); the run stopped there: the lanes after it were not checked"
        )
        if can_isolate(lane["runtime"]):
            message += (
                f" (with --runtime {lane['runtime']}@python it runs in a worker process of its "
                "own, where a crash is its result and the run goes on)"
            )
        localised = lane["doing"] != "ran"
        crash = Result.about(
            lane["case"], lane["component"], runtime=lane["runtime"], ep=lane["ep"],
            input_set="localisation" if localised else "all", status=str(Status.CRASH),
            message=message, precision=lane["precision"], cell=lane["cell"],
        )  # fmt: skip
        return [*self.results, crash], self.settings


def check_in_child(send, request, started: str) -> dict:
    """In the check's process: the factory, its inputs and the whole check (tconform.pipeline);
    what the report needs comes back (results, settings, details, localisations, where versions
    part, and the environment block, taken here, where torch is loaded anyway)."""
    from tconform.pipeline import run
    from tconform.report import RunReport
    from tconform.report.environment import environment
    from tconform.runtimes import label
    from tconform.suites import open_suite

    report = RunReport("check")
    progress = lambda line: send(("progress", line))  # noqa: E731

    def watch(lane, doing, results) -> None:  # each lane as it starts and ends (LanesSoFar)
        if results is not None:
            send(("results", results))
            return
        runtime = lane.runtime
        described = {
            "label": label(runtime), "case": lane.case.name, "component": lane.case.component,
            "runtime": runtime.name, "ep": runtime.ep, "cell": lane.cell,
            "precision": lane.precision, "doing": doing,
        }  # fmt: skip
        send(("lane", (described, _plain({"settings": report.settings})["settings"])))

    with open_suite(request, progress) as suite:
        run(request, suite, report, progress, watch)
    send(("phase", "sending the results"))
    return {
        # As JSON holds them: plain values, which the parent reads back without torch (the
        # environment's torch version is torch's own str type, say).
        **_plain(
            {
                "environment": environment(started, request.runtimes.threads),
                "settings": report.settings,
                "details": report.details,
            }
        ),
        "results": report.results,
        "localisations": report.localisations,
        "partings": report.partings,
    }


def _plain(data: dict) -> dict:
    """`data` as JSON would read it back (what the reports hold anyway)."""
    import json

    from tconform.report.json_report import strict

    return json.loads(json.dumps(strict(data), default=str))
