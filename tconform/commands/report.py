"""`tconform report`: work with the reports of other runs (`report merge`: shard reports)."""

from __future__ import annotations

import click

from tconform.commands.options import (
    RegularFile,
    quiet_option,
    report_options,
    require_reports_apart,
)
from tconform.commands.run import run_and_report, writes_report
from tconform.errors import one_line


@click.group("report")
def report() -> None:
    """Work with the JSON reports of other runs."""


@writes_report("verify")
@report.command("merge")
@click.argument(
    "shard_reports",
    metavar="REPORTS...",
    nargs=-1,
    required=True,
    type=RegularFile(),
)
@report_options("json", "junit", "markdown", "plot")
@quiet_option()
def merge(shard_reports, reports, quiet) -> None:
    """Merge the JSON reports of `verify --shard K/N` (or `check --shard K/N`) runs into one.

    They must come from one command, the same goldens (or model), tconform version and unit
    list, and hold every unit exactly once (else exit 2). Exit codes as for verify, over the
    merged results.
    """
    from tconform.report import RunReport
    from tconform.report.merge import merge as merge_reports

    require_reports_apart(shard_reports, *reports.values())

    def run(report, progress) -> None:
        merged = merge_reports(list(shard_reports))
        report.command = merged.command  # verify, or check of a user's model
        report.settings, report.details = merged.settings, merged.details
        report.results, report.error = merged.results, merged.error
        progress(
            f"merged {len(shard_reports)} reports: {len(merged.settings['units']['ids'])} units"
        )
        for found in merged.details.get("localisation", []):  # as each shard printed it
            progress(f"localisation on {found['runtime']}: {one_line(found['verdict'])}")

    run_and_report(RunReport("verify"), run, quiet, reports)  # its table, pivot and versions
