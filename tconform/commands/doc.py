"""`tconform doc`: check the documents' worked numbers and stated properties.

Prints one row per case (verdict about the document, worst deviation, status on each runtime)
and one per property. Exit codes follow every command's rule: 0 when every runtime agrees with
the oracle, whatever the verdicts (errata are facts about the documents); 1 when a runtime
disagrees beyond tolerance; 3 when a requested provider cannot run, also where
--allow-missing-ep made every model row a skip (nothing checked is never a pass); 2 for bad
input.
"""

from __future__ import annotations

import click

from tconform.commands.options import (
    RuntimeCommand,
    artifacts_option,
    crash_folder_beside,
    quiet_option,
    report_options,
    runtime_options,
)
from tconform.commands.run import run_and_report, writes_report

SHORT = {
    "pass": "pass",
    "fail": "FAIL",
    "unavailable": "n/a",
    "error": "ERROR",
    "crash": "CRASH",
    "skip": "skip",
}


def format_doc_table(report) -> str:
    """Cases with their verdict and worst deviation, then properties per runtime."""
    from tconform.report.text import format_table

    case_rows = []
    for case in report.cases:
        source = case.source.split("_")[0] if case.source[0].isdigit() else "paper"
        outcomes = report.case_runtimes.get(case.id, {})
        runtimes = " ".join(f"{name}:{SHORT[o.status]}" for name, o in outcomes.items())
        case_rows.append(
            (case.id, source, case.verdict, f"{case.worst_deviation:.3g}", runtimes or "-")
        )
    property_rows = [
        (
            prop.id,
            prop.runtime,
            SHORT[prop.status],
            "-" if prop.violation is None else f"{prop.violation:.3g}",
            "-" if prop.limit is None else f"{prop.limit:g}",
            prop.message if prop.status in ("unavailable", "skip") else "",
        )
        for prop in report.properties
    ]
    errata = sum(c.verdict != "holds" for c in report.cases)
    return "\n".join(
        [
            format_table(("case", "source", "verdict", "worst dev", "runtimes"), case_rows, [3]),
            "",
            format_table(
                ("property", "runtime", "status", "violation", "limit", "note"),
                property_rows,
                [3, 4],
            ),
            "",
            f"{len(report.cases)} cases, {errata} not holding (errata, deviating listings, "
            f"differing counts: see docs/errata.md); {report.runtime_failures} runtime "
            "disagreements",
        ]
    )


@writes_report("doc")
@click.command("doc", cls=RuntimeCommand)
@artifacts_option("Artifacts folder; the document components are exported under DIR/doc/<config>/.")
@runtime_options("runtime", "ep", "allow_missing_ep", "no_torch")
@report_options("json", "junit", "markdown")
@quiet_option()
def doc(artifacts_dir, runtime, reports, quiet):
    """Check every worked number and stated property of the five documents."""
    from tconform.doc import report_results, run_document_checks
    from tconform.errors import EXIT_EP_UNAVAILABLE, TconformError
    from tconform.report import RunReport
    from tconform.results import allow_missing, unchecked_lanes
    from tconform.runtimes import runtime_class

    def run(report, progress) -> None:
        options = runtime.options(crash_folder_beside(*reports.values()))
        report.settings = {
            "artifacts": str(artifacts_dir),
            "eps": list(options.eps),
            "runtimes": list(options.names),
            "runtime_options": dict(options.settings),
        }
        checked = run_document_checks(options, artifacts_dir, progress)
        report.settings["runtimes"] = checked.runtime_settings
        report.details = checked.to_dict()
        report.results = report_results(checked)
        if runtime.allow_missing_ep:
            allow_missing(report.results)
        click.echo(format_doc_table(checked))
        for line in report.worker_runtimes().values():
            click.echo(f"in a worker: {line}")
        if report.versions_text():  # a runtime under two or more specs: where releases part
            click.echo("\n" + report.versions_text())
        # Its model lanes: the rows of runtimes that run the exported models, as in verify.
        onnx = [r for r in report.results if r.runtime in options.names]
        onnx = [r for r in onnx if runtime_class(r.runtime).consumes == "onnx"]
        why = unchecked_lanes(onnx, report.results)
        if why:
            raise TconformError.with_code(why, EXIT_EP_UNAVAILABLE)

    run_and_report(RunReport("doc"), run, quiet, reports, render=lambda report: "")
