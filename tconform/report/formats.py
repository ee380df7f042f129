"""The report formats, in one registry: each is an option (`--json FILE`), the suffix its file
needs, its help, and the module that writes a run report in it.

A new format is its writer plus one line in FORMATS: `report_options(...)` (the commands'
`--json`, `--junit`, ...), the run frame (`tconform.commands.run`) and the reports a usage error
still writes all read this table. A writer is a module (or `module:object`) with
`write(path, report)` and, where a file of its format can be recognised as tconform's own,
`is_own(path)`: only such formats are written for a usage error that stops a command before it
runs, and only over a file of their own kind. A kind of report that is not a run report (bench's)
names its own writer per format (`writers`); it offers only the formats it names.

Importing this module is cheap (nothing beyond the standard library).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ReportFormat:
    flag: str  # the command-line option
    suffix: str | None  # the suffix its file must have (None: any)
    help: str
    writer: str  # writes a run report: "module" or "module:object" with write(path, report)

    @property
    def dest(self) -> str:
        """The option's parameter name in a command (`--json` -> json_path)."""
        return self.flag.lstrip("-").replace("-", "_") + "_path"


FORMATS: dict[str, ReportFormat] = {
    "json": ReportFormat("--json", None, "Write the JSON report.", "tconform.report.json_report"),
    "junit": ReportFormat("--junit", None, "Write JUnit XML (for CI).", "tconform.report.junit"),
    "markdown": ReportFormat(
        "--markdown", None, "Write a markdown summary.", "tconform.report.markdown"
    ),
    "plot": ReportFormat("--plot", ".png", "Write a PNG plot.", "tconform.report.plot"),
}


@dataclass(frozen=True)
class Writer:
    """A report kind's writer for one format, where it is not a module of its own."""

    write: Callable[[Path, Any], None]
    is_own: Callable[[Path], bool] | None = None


def writer(report: object, fmt: str) -> Any:
    """What writes `report` in format `fmt`: the report kind's own writer where it names one
    (`report.writers`), else the format's (a run report's)."""
    own = getattr(report, "writers", None)
    if own is not None and fmt not in own:
        raise KeyError(f"a {type(report).__name__} has no {fmt} format")
    reference = own[fmt] if own is not None else FORMATS[fmt].writer
    module, _, name = reference.partition(":")
    found = importlib.import_module(module)
    return getattr(found, name) if name else found


def write_reports(report: object, paths: dict[str, Path | None]) -> dict[str, str]:
    """Every requested report file, format by format; returns the one line of each that could
    not be written (format -> line), so that one that fails does not stop the others. The paths
    were checked before the run, and each is checked again as it is written: one that came to
    hold anything else meanwhile (a user's file, a symbolic link) is left as it is."""
    from tconform.errors import UsageError

    failed = {}
    for fmt, path in paths.items():
        if path is None:
            continue
        if os.path.lexists(path) and not is_own_report(report, fmt, path):
            failed[fmt] = (
                f"{path}: appeared during the run and is not a {fmt} report tconform wrote; "
                "left as it is (name a new file)"
            )
            continue
        try:
            writer(report, fmt).write(path, report)
        except UsageError as exc:  # a full disk, a folder it cannot write
            failed[fmt] = str(exc)
    return failed


def is_own_report(report: object, fmt: str, path: Path) -> bool:
    """Whether `path` is a regular file (not a symbolic link) holding a report in format `fmt`
    of `report`'s kind that tconform wrote, so that replacing it loses nothing."""
    is_own = getattr(writer(report, fmt), "is_own", None)
    return path.is_file() and not path.is_symlink() and is_own is not None and bool(is_own(path))
