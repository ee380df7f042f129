"""Folder roles: a golden folder and an artifacts folder are different things, and tconform never
writes one kind of file into the other kind of folder.

Each folder tconform writes holds a `manifest.json` that says what it is (`"kind"`; manifests
written before that field existed are recognised by their keys). A folder without a manifest is
nobody's: tconform writes into it only when it is empty or missing.
"""

from __future__ import annotations

import json
from pathlib import Path

from tconform.errors import UsageError

MANIFEST = "manifest.json"
GOLDEN = "tconform-golden"
ARTIFACTS = "tconform-artifacts"
MAX_MANIFEST_BYTES = 64 * 2**20  # far above any real manifest; refuse before reading a huge file


def read_json_manifest(path: Path) -> dict:
    """A manifest's JSON object, or one-line UsageError naming the file."""
    if not path.is_file():
        raise UsageError(f"{path}: missing or not a regular file")
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise UsageError(f"{path}: {path.stat().st_size} bytes, too large for a manifest")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable JSON manifest ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: not a tconform manifest (a JSON object is expected)")
    return data


def manifest_kind(folder: Path) -> str | None:
    """GOLDEN, ARTIFACTS, or None when the folder has no manifest. A manifest of neither kind is
    an error: tconform does not guess what a folder holds."""
    path = folder / MANIFEST
    if not path.exists():
        return None
    data = read_json_manifest(path)
    kind = data.get("kind")
    if kind in (GOLDEN, ARTIFACTS):
        return kind
    if kind is None and "cases" in data and "stored_dtype" in data:
        return GOLDEN
    if kind is None and "models" in data:
        return ARTIFACTS
    raise UsageError(f"{path}: neither a golden nor an artifacts manifest")


def require_artifacts_folder(folder: Path) -> None:
    """Models go only into an artifacts folder: one with an artifacts manifest, or a new one."""
    if manifest_kind(folder) == GOLDEN:
        raise UsageError(
            f"{folder} holds goldens ({folder / MANIFEST} is a golden manifest); "
            "models go into an artifacts folder of their own (e.g. --out artifacts)"
        )


def require_replaceable_golden_folder(folder: Path) -> None:
    """`golden --force` replaces a golden folder, or fills an empty or missing one; never
    anything else."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise UsageError(f"{folder}: exists and is not a folder")
    kind = manifest_kind(folder)
    if kind == GOLDEN:
        return
    if kind is None and not any(folder.iterdir()):
        return
    what = "an artifacts folder" if kind == ARTIFACTS else "a folder that is not a golden folder"
    raise UsageError(f"{folder} is {what}; golden --force replaces only golden folders")
