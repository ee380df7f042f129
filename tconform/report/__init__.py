"""Reports of a run: terminal table, JSON (stable schema), JUnit XML, markdown, plot.

A run's report is written even when the run stops early: `RunReport.error` then says why, and
the results gathered so far are kept, so a CI system's report step always finds its files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tconform.report.formats import FORMATS, write_reports
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
    # tconform.localise.Localisation of each localised lane (the JSON's details hold them too)
    localisations: list = field(default_factory=list, repr=False)
    # tconform.localise.versions.Parting of each two versions of a runtime localised on one
    # model: where they part (the JSON's details hold them too)
    partings: list = field(default_factory=list, repr=False)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    def to_dict(self) -> dict[str, object]:
        from tconform.report import json_report

        return json_report.build(self)

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return int(self.error["exit_code"])
        return exit_code(r.status for r in self.results)

    def render(self) -> str:
        """The terminal table of the results ('' when there are none; a matrix run's pivot of
        cases x cells too), each localisation, where localised versions of a runtime part, and
        the comparison of a runtime's versions where the run has two or more."""
        from tconform.report import table

        if not self.results:
            return ""
        from tconform.report.pivot import render_with_pivot

        # a matrix run: its pivot of cases x cells too
        rows = render_with_pivot(self.results) if self.settings.get("matrix") else None
        given = [  # with the request's own option on where sessions may run
            *(self.settings.get("runtime_options") or []),
            *(["--strict-placement"] if self.settings.get("strict_placement") else []),
        ]
        parts = [
            rows or table.render(self.results),
            given and "runtime options: " + " ".join(given),
            "\n".join(f"in a worker: {line}" for line in self.worker_runtimes().values()),
            *rendered_localisations(self.localisations),
            *(f"versions: {parting.verdict}" for parting in self.partings),
            self.versions_text(),
        ]
        return "\n\n".join(part for part in parts if part)

    def worker_runtimes(self) -> dict[str, str]:
        """Each runtime that ran in a worker (a release, an interpreter) by label: its spec and
        the exact packages and Python of its environment, in one line."""
        found = {}
        runtimes = self.settings.get("runtimes")
        for name, settings in (runtimes if isinstance(runtimes, dict) else {}).items():
            worker = settings.get("worker") if isinstance(settings, dict) else None
            if not isinstance(worker, dict):
                continue
            packages = worker.get("packages") if isinstance(worker.get("packages"), dict) else {}
            shown = [f"{k} {v}" for k, v in packages.items()]
            shown.append(f"Python {worker.get('python_version')} ({worker.get('python')})")
            found[str(name)] = f"{settings.get('spec', name)}: {', '.join(shown)}"
        return found

    def version_groups(self) -> list:
        """tconform.report.versions' groups: a runtime run under two or more specs."""
        from tconform.report.versions import version_groups

        return version_groups(self.results, self.settings)

    def versions_text(self) -> str:
        from tconform.report.versions import render

        return render(self.version_groups())

    def summary(self) -> str:
        """The last line a finished run prints (`145 results: 145 pass`)."""
        from tconform.report import table

        return table.summary(self.results)


__all__ = ["FORMATS", "RunReport", "write_reports"]


def rendered_localisations(localisations: list) -> list[str]:
    """Each localisation as text; tconform.localise (which imports torch, seconds in a
    command's own process) only where there is one."""
    if not localisations:
        return []
    from tconform.localise import render

    return [render(localisation) for localisation in localisations]
