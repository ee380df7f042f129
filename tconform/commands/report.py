"""`tconform report`: work with the reports of other runs (`report merge`: shard reports)."""

from __future__ import annotations

from pathlib import Path

import click

from tconform.commands.options import quiet_option, report_options, require_reports_apart
from tconform.commands.run import run_and_report, writes_run_report


@click.group("report")
def report() -> None:
    """Work with the JSON reports of other runs."""


@writes_run_report("verify")
@report.command("merge")
@click.argument(
    "reports",
    nargs=-1,
    required=True,
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
)
@report_options("json", "junit", "markdown", "plot")
@quiet_option()
def merge(reports, json_path, junit_path, markdown_path, plot_path, quiet) -> None:
    """Merge the JSON reports of `verify --shard K/N` runs into one report.

    They must come from the same goldens, tconform version and unit list, and hold every unit
    exactly once (else exit 2). Exit codes as for verify, over the merged results.
    """
    from tconform.report import pivot, table
    from tconform.report.merge import merge as merge_reports

    require_reports_apart(reports, json_path, junit_path, markdown_path, plot_path)
    settings: dict = {}

    def run(report, progress) -> None:
        merged = merge_reports(list(reports))
        report.settings, report.details = merged.settings, merged.details
        report.results, report.error = merged.results, merged.error
        settings.update(merged.settings)
        progress(f"merged {len(reports)} reports: {len(merged.settings['units']['ids'])} units")

    def render(results):
        # A matrix run's shards merge into a matrix report, shown with its pivot.
        return (pivot.render_with_pivot if settings.get("matrix") else table.render)(results)

    run_and_report("verify", run, quiet, json_path, junit_path, markdown_path, plot_path, render)
