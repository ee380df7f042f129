"""tconform check's export folder (`--out`, default artifacts/check/<name>): what it may write
there, decided before anything runs. Importing this module is cheap (no torch): the command
line refuses a folder before it starts the check's process. Inside an artifacts folder, its
`check/` area is tconform check's (the default folder lies there, so `check` works where
`tconform verify` made artifacts/); everywhere else in a golden or artifacts folder is not.

The folder is tconform check's own only as far as its `check.json` says: that record, with the
tool's marker, holds the sha256 of each file check wrote (model.onnx, export.log, a precision
plan's plan.json). A file that is not recorded so, or changed since, is never replaced, and
neither is a `check.json` that tconform check did not write (no marker, an unreadable record,
hashes that are not sha256 digests of its own files); nor is anything written into a golden or
artifacts folder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tconform.errors import Refused, UsageError
from tconform.files import (
    SHA256_DIGEST,
    atomic_write_json,
    held_as_locked,
    read_json_object,
    resolved,
    sha256_file,
)
from tconform.folders import (
    ARTIFACTS,
    BUNDLE_MARKER,
    BUNDLE_TOOL,
    CHECK_AREA,
    CHECK_EXPORT,
    CHECK_RECORD,
    CHECK_TOOL,
    GOLDEN,
    MANIFEST,
    REPRO_BUNDLE,
    folder_lock,
    is_lock,
    managed_folder,
    manifest_kind,
    require_new_or_written_whole,
    require_not_link,
)

OWN_RECORD, TOOL = CHECK_RECORD, CHECK_TOOL  # what tconform check wrote into its export folder
OWN_FILES = ("model.onnx", "export.log", "plan.json")
MATRIX = "matrix"  # its matrix cells' folders, each of its own files
MAX_RECORD_BYTES = 2**20  # a record is a few hundred bytes
OUT = "--out (bench: --artifacts)"  # the option that names the folder, in every message


def require_target(target: str) -> str:
    """`target` if it is PACKAGE.MODULE:FACTORY, dotted Python names and one name (it is
    imported, and names the default export folder): checked before anything runs."""
    module, sep, factory = target.partition(":")
    if not (sep and factory.isidentifier() and all(p.isidentifier() for p in module.split("."))):
        raise UsageError(
            f"{target!r:.120}: expected PACKAGE.MODULE:FACTORY, each a Python name (e.g. "
            "examples.tiny_gpt:make)"
        )
    return target


def default_export_dir(name: str) -> Path:
    """Where `tconform check` exports a module named `name` unless told otherwise: a folder of
    the check area named after it, never a path of its own (`../x` is refused)."""
    folder = name.replace(":", ".")
    if Path(folder).name != folder or folder in ("", ".", ".."):
        raise UsageError(f"{name!r:.120}: not a plain name for the export folder; give {OUT}")
    return Path("artifacts") / CHECK_AREA / folder


def export_folder(target: str, out_dir: Path | None) -> Path:
    """The folder a user's model is exported into: --out, else its default."""
    return Path(out_dir) if out_dir is not None else default_export_dir(target)


@contextlib.contextmanager
def export_lock(folder: Path) -> Iterator[None]:
    """Hold `folder`'s lock while a run exports into it and runs what it exported: a second
    run with the same folder (another target, other options) waits, rather than export over
    the model the first is checking and check the other's. The folder is checked before its
    parent is made for the lock."""
    require_own_export_folder(folder)
    resolved(folder).parent.mkdir(parents=True, exist_ok=True)
    with folder_lock(folder):
        # made under the lock and held as this folder (files.held_as_locked): one moved away
        # mid-run and another put in its place is neither written nor read as the run's own
        resolved(folder).mkdir(exist_ok=True)
        with held_as_locked(folder):
            yield


def _recorded(folder: Path) -> dict[str, str]:
    """The sha256 of each file check wrote here, as its check.json records them ({} without
    one); a check.json tconform check did not write is a UsageError: it is never replaced."""
    record = folder / OWN_RECORD
    if not record.exists() and not record.is_symlink():
        return {}
    refused = Refused(
        f"{record}: not written by tconform check (or changed since); choose another {OUT}", folder
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
        or not all(isinstance(h, str) and SHA256_DIGEST.fullmatch(h) for h in hashes.values())
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
    require_not_link(folder, f"check's export folder, {OUT}")
    if folder.exists() and not folder.is_dir():
        raise Refused(f"{folder}: exists and is not a folder", folder)
    managed = managed_folder(folder, (GOLDEN, ARTIFACTS), itself=True)
    if (folder / MANIFEST).exists() or (managed is not None and not in_check_area(folder, managed)):
        raise Refused(
            f"{folder} is or lies in a golden or artifacts folder ({managed or folder}); "
            f"{OUT} needs a folder of its own",
            folder,
        )
    bundle = managed_folder(folder, (REPRO_BUNDLE,), itself=True)
    if bundle is not None:  # writing there changes the bundle, which --repro then refuses
        raise Refused(
            f"{folder} is or lies in {bundle}, a bundle tconform check --repro wrote; {OUT} "
            "needs a folder of its own",
            folder,
        )
    owner = managed_folder(folder, (CHECK_EXPORT,))  # another check's, but for its matrix cells
    if owner is not None and resolved(folder).parent != owner / MATRIX:
        raise Refused(
            f"{folder} lies in {owner}, tconform check's export folder; {OUT} needs a "
            "folder of its own",
            folder,
        )
    _require_only_own_files(folder, (MATRIX,))
    matrix = folder / MATRIX
    if matrix.is_symlink() or (matrix.exists() and not matrix.is_dir()):
        raise Refused(f"{matrix}: not a folder tconform check made; choose another {OUT}", folder)
    for cell in sorted(matrix.iterdir()) if matrix.is_dir() else ():
        if cell.is_symlink() or not cell.is_dir():
            raise Refused(
                f"{cell}: not a matrix cell's folder tconform check made; choose another {OUT}",
                folder,
            )
        _require_only_own_files(cell)


def _require_only_own_files(folder: Path, folders: tuple[str, ...] = ()) -> None:
    """`folder` holds nothing but the files check wrote there as it wrote them (its record
    says their hashes), the `folders` named, and locks."""
    recorded = _recorded(folder)
    if folder.is_dir():
        others = sorted(  # a lock beside a folder inside it (.NAME.lock) is tconform's too
            p.name
            for p in folder.iterdir()
            if p.name not in (*OWN_FILES, OWN_RECORD, *folders) and not is_lock(p)
        )
        if others:
            raise Refused(
                f"{folder}: holds {others[0]!r}, which tconform check did not write; {OUT} needs "
                "a new or empty folder, or one of its own",
                folder,
            )
    for name in OWN_FILES:
        path = folder / name
        present = path.exists() or path.is_symlink()
        if present and (
            path.is_symlink() or not path.is_file() or sha256_file(path) != recorded.get(name)
        ):
            ways = f"check it as it is with --model {path}, or " if name == "model.onnx" else ""
            raise Refused(
                f"{path}: not written by tconform check (or changed since); {ways}choose "
                f"another {OUT}",
                folder,
            )


def require_repro_folder(folder: Path, others: list[Path]) -> None:
    """--repro's folder, before anything runs: new, or a bundle tconform wrote and that is as it
    wrote it (folders.require_new_or_written_whole), and apart from every file or folder the
    check reads or writes (`others`: the model, the inputs, the export folder, the reports),
    which replacing the bundle would take with it, or which would land in the bundle."""
    require_new_or_written_whole(folder, BUNDLE_MARKER, BUNDLE_TOOL, "--repro")
    target = resolved(folder)
    for other in others:
        theirs = resolved(other)
        if theirs.is_relative_to(target) or target.is_relative_to(theirs):
            raise Refused(
                f"{folder}: holds or lies in {other}, which this check reads or writes; --repro "
                "needs a folder of its own",
                folder,
            )


def record_own_files(folder: Path) -> None:
    """check.json: the sha256 of each file check has written into `folder`."""
    hashes = {n: sha256_file(folder / n) for n in OWN_FILES if (folder / n).is_file()}
    atomic_write_json(folder / OWN_RECORD, {"tool": TOOL, "sha256": hashes})
