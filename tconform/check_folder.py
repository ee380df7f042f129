"""tconform check's export folder (`--out`, default artifacts/check/<name>): what it may write
there, decided before anything runs. Importing this module is cheap (no torch): the command
line refuses a folder before it starts the check's process. Inside an artifacts folder, its
`check/` area is tconform check's (the default folder lies there, so `check` works where
`tconform verify` made artifacts/); everywhere else in a golden or artifacts folder is not.

The folder is tconform check's own only as far as its `check.json` says: that record, with the
tool's marker, holds the sha256 of each file check wrote (model.onnx, export.log). A file that is
not recorded so, or changed since, is never replaced, and neither is a `check.json` that
tconform check did not write (no marker, an unreadable record, hashes that are not sha256
digests of its own files); nor is anything written into a golden or artifacts folder.
"""

from __future__ import annotations

import re
from pathlib import Path

from tconform.errors import UsageError
from tconform.files import atomic_write_json, read_json_object, resolved, sha256_file
from tconform.folders import ARTIFACTS, MANIFEST, managed_folder, manifest_kind

OWN_RECORD = "check.json"  # what tconform check wrote into its export folder
OWN_FILES = ("model.onnx", "export.log")
TOOL = "tconform check"
MAX_RECORD_BYTES = 2**20  # a record is a few hundred bytes
_SHA256 = re.compile(r"[0-9a-f]{64}")


CHECK_AREA = "check"  # an artifacts folder's subfolder for tconform check's exports


def default_export_dir(name: str) -> Path:
    """Where `tconform check` exports a module named `name` unless told otherwise."""
    return Path("artifacts") / CHECK_AREA / name.replace(":", ".")


def _recorded(folder: Path) -> dict[str, str]:
    """The sha256 of each file check wrote here, as its check.json records them ({} without
    one); a check.json tconform check did not write is a UsageError: it is never replaced."""
    record = folder / OWN_RECORD
    if not record.exists() and not record.is_symlink():
        return {}
    refused = UsageError(
        f"{record}: not written by tconform check (or changed since); choose another --out"
    )
    if record.is_symlink() or not record.is_file():
        raise refused
    try:
        data = read_json_object(record, MAX_RECORD_BYTES, what="check record")
    except UsageError:
        raise refused from None
    hashes = data.get("sha256")
    if (
        data.get("tool") != TOOL
        or not isinstance(hashes, dict)
        or not set(hashes) <= set(OWN_FILES)
        or not all(isinstance(h, str) and _SHA256.fullmatch(h) for h in hashes.values())
    ):
        raise refused
    return hashes


def in_check_area(folder: Path, managed: Path | None) -> bool:
    """Whether `folder` lies in the `check/` area of the artifacts folder `managed`: the one
    place inside an artifacts folder that is tconform check's (as doc/ is the document
    checks'), so that its default folder works where `tconform verify` made artifacts/."""
    if managed is None or manifest_kind(managed) != ARTIFACTS:
        return False
    area = managed / CHECK_AREA
    absolute = resolved(folder)
    return absolute != area and absolute.is_relative_to(area)


def require_own_export_folder(folder: Path) -> None:
    """check writes only where it may replace what is there: a new or tconform check's own
    folder, never a golden or artifacts folder (but for an artifacts folder's check/ area),
    never over a file it did not write."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder}: exists and is not a folder")
    managed = managed_folder(folder, itself=True)
    if (folder / MANIFEST).exists() or (managed is not None and not in_check_area(folder, managed)):
        raise UsageError(
            f"{folder} is or lies in a golden or artifacts folder ({managed or folder}); "
            "check --out needs a folder of its own"
        )
    recorded = _recorded(folder)
    for name in OWN_FILES:
        path = folder / name
        present = path.exists() or path.is_symlink()
        if present and (
            path.is_symlink() or not path.is_file() or sha256_file(path) != recorded.get(name)
        ):
            ways = f"check it as it is with --model {path}, or " if name == "model.onnx" else ""
            raise UsageError(
                f"{path}: not written by tconform check (or changed since); {ways}choose "
                "another --out"
            )


def record_own_files(folder: Path) -> None:
    """check.json: the sha256 of each file check has written into `folder`."""
    hashes = {n: sha256_file(folder / n) for n in OWN_FILES if (folder / n).is_file()}
    atomic_write_json(folder / OWN_RECORD, {"tool": TOOL, "sha256": hashes})
