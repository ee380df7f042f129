"""`tconform doc`: check the documents' worked numbers and stated properties.

Prints one row per case (verdict about the document, worst deviation, status on each runtime)
and one per property. Exit 0 when every runtime agrees with the oracle, whatever the verdicts
(errata are facts about the documents); 1 when a runtime disagrees beyond tolerance.
"""

from __future__ import annotations

from pathlib import Path

import click

from tconform.doc import DocReport, run_document_checks
from tconform.files import atomic_write_json
from tconform.runtimes.onnxruntime import parse_eps

SHORT = {"pass": "pass", "fail": "FAIL", "unavailable": "n/a", "error": "ERROR"}


def _runtime_cell(report: DocReport, case_id: str) -> str:
    outcomes = report.case_runtimes.get(case_id, {})
    if not outcomes:
        return "-"
    return " ".join(
        f"{name.removeprefix('onnxruntime-')}:{SHORT[o.status]}" for name, o in outcomes.items()
    )


def format_table(report: DocReport) -> str:
    lines = [f"{'case':30s} {'source':9s} {'verdict':9s} {'worst dev':>10s}  runtimes"]
    for case in report.cases:
        source = case.source.split("_")[0] if case.source[0].isdigit() else "paper"
        lines.append(
            f"{case.id:30s} {source:9s} {case.verdict:9s} {case.worst_deviation:10.3g}  "
            f"{_runtime_cell(report, case.id)}"
        )
    lines.append("")
    lines.append(f"{'property':30s} {'runtime':18s} {'status':8s} {'violation':>10s}  limit")
    for prop in report.properties:
        violation = "-" if prop.violation is None else f"{prop.violation:.3g}"
        limit = "-" if prop.limit is None else f"{prop.limit:g}"
        lines.append(
            f"{prop.id:30s} {prop.runtime:18s} {SHORT[prop.status]:8s} {violation:>10s}  {limit}"
            + (f"  ({prop.message})" if prop.status == "unavailable" else "")
        )
    errata = sum(c.verdict != "holds" for c in report.cases)
    lines.append("")
    lines.append(
        f"{len(report.cases)} cases, {errata} not holding (errata, deviating listings, differing "
        f"counts: see docs/errata.md); {report.runtime_failures} runtime disagreements"
    )
    return "\n".join(lines)


@click.command("doc")
@click.option(
    "--artifacts",
    type=click.Path(path_type=Path),
    default=Path("artifacts"),
    show_default=True,
    help="Artifacts folder; the document components are exported under DIR/doc/<config>/.",
)
@click.option("--ep", default="cpu", show_default=True, help="Providers: cpu, cpu,cuda or all.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write a JSON report.")
def doc(artifacts: Path, ep: str, json_path: Path | None) -> None:
    """Check every worked number and stated property of the five documents."""
    report = run_document_checks(parse_eps(ep), artifacts, lambda line: click.echo(line, err=True))
    click.echo(format_table(report))
    if json_path is not None:
        atomic_write_json(json_path, report.to_dict())
        click.echo(f"wrote {json_path}")
    if report.runtime_failures:
        raise SystemExit(1)
