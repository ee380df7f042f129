"""The JSON report; its schema is documented in the README and kept stable."""

from __future__ import annotations

from pathlib import Path

from tconform.files import atomic_write_json
from tconform.report.environment import environment
from tconform.results import Result
from tconform.versions import tool_version


def build(results: list[Result], settings: dict[str, object]) -> dict[str, object]:
    return {
        "tool": "tconform",
        "version": tool_version(),
        "environment": environment(),
        "settings": settings,
        "results": [r.to_dict() for r in results],
    }


def write(path: Path, results: list[Result], settings: dict[str, object]) -> None:
    atomic_write_json(path, build(results, settings))
