"""The JSON report; its schema is documented in the README and only ever gains fields."""

from __future__ import annotations

from pathlib import Path

from tconform.errors import UsageError
from tconform.files import atomic_write_json, read_json_object
from tconform.report import RunReport
from tconform.versions import tool_version

SCHEMA = "tconform-report/2"


def build(report: RunReport) -> dict[str, object]:
    return {
        "tool": "tconform",
        "schema": SCHEMA,
        "command": report.command,
        "version": tool_version(),
        "environment": report.environment,
        "settings": report.settings,
        "exit_code": report.exit_code,
        "error": report.error,
        "results": [r.to_dict() for r in report.results],
        **({"details": report.details} if report.details else {}),
    }


def write(path: Path, report: RunReport) -> None:
    atomic_write_json(path, build(report))


def is_own(path: Path) -> bool:
    """Whether `path` holds a JSON report tconform wrote (so replacing it loses nothing), of
    this schema or an earlier version of it."""
    try:
        data = read_json_object(path)
    except UsageError:
        return False
    family = SCHEMA.rsplit("/", 1)[0] + "/"
    return data.get("tool") == "tconform" and str(data.get("schema", "")).startswith(family)
