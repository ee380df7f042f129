"""The JSON report; its schema is documented in the README and only ever gains fields."""

from __future__ import annotations

import math
from pathlib import Path

from tconform.errors import UsageError
from tconform.files import atomic_write_json, read_json_object
from tconform.report import RunReport
from tconform.versions import tool_version

SCHEMA = "tconform-report/2"


def build(report: RunReport) -> dict[str, object]:
    groups = report.version_groups()  # a runtime under two or more specs: their comparison
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
        **({"versions": [g.to_dict() for g in groups]} if groups else {}),
    }


def write(path: Path, report: RunReport) -> None:
    atomic_write_json(path, strict(build(report)))


def strict(data: object) -> object:
    """`data` as strict JSON can hold it: a NaN or infinity anywhere (a user's tolerance, a
    measurement of nothing) becomes the text "nan", "inf" or "-inf", never a bare NaN that
    strict parsers refuse."""
    if isinstance(data, float) and not math.isfinite(data):
        return str(data)
    if isinstance(data, dict):
        return {key: strict(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [strict(value) for value in data]
    return data


def is_own(path: Path) -> bool:
    """Whether `path` holds a JSON report tconform wrote (so replacing it loses nothing), of
    this schema or an earlier version of it."""
    try:
        data = read_json_object(path)
    except UsageError:
        return False
    family = SCHEMA.rsplit("/", 1)[0] + "/"
    return data.get("tool") == "tconform" and str(data.get("schema", "")).startswith(family)
