"""Reports of a run: terminal table, JSON (stable schema), JUnit XML, markdown, plot.

A run's report is written even when the run stops early: `RunReport.error` then says why, and
the results gathered so far are kept, so a CI system's report step always finds its files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tconform.results import Result, exit_code


@dataclass
class RunReport:
    """What one command produced: results, the settings they were obtained with, the
    environment, and the error that ended the run early (None if it ran to the end)."""

    command: str
    results: list[Result] = field(default_factory=list)
    settings: dict[str, object] = field(default_factory=dict)
    environment: dict[str, object] = field(default_factory=dict)
    error: dict[str, object] | None = None  # {"message": ..., "exit_code": ...}
    details: dict[str, object] = field(default_factory=dict)  # a command's own payload

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return int(self.error["exit_code"])
        return exit_code(r.status for r in self.results)


def write_reports(
    report: RunReport,
    json_path: Path | None = None,
    junit_path: Path | None = None,
    markdown_path: Path | None = None,
    plot_path: Path | None = None,
) -> None:
    """Every requested report file (paths were checked before the run started)."""
    from tconform.report import json_report, junit, markdown, plot

    if json_path:
        json_report.write(json_path, report)
    if junit_path:
        junit.write(junit_path, report)
    if markdown_path:
        markdown.write(markdown_path, report)
    if plot_path and report.settings.get("matrix"):
        from tconform.report import pivot

        pivot.write_heatmap(plot_path, report.results)
    elif plot_path:
        plot.write(plot_path, report.results)
