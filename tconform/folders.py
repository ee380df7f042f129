"""Folder roles: a golden folder and an artifacts folder are different things, and tconform never
writes one kind of file into the other kind of folder.

Each folder tconform writes holds a `manifest.json` that says what it is (`"kind"`; manifests
written before that field existed are recognised by their keys). A folder without a manifest is
nobody's: tconform writes into it only when it is empty or missing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tconform.errors import UsageError
from tconform.files import files_under, read_json_object, resolved
from tconform.variables import value

MANIFEST = "manifest.json"
GOLDEN = "tconform-golden"
ARTIFACTS = "tconform-artifacts"
MAX_MANIFEST_BYTES = 64 * 2**20  # far above any real manifest; refuse before reading a huge file


def read_json_manifest(path: Path) -> dict:
    """A manifest's JSON object, or one-line UsageError naming the file."""
    return read_json_object(path, MAX_MANIFEST_BYTES, "manifest")


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


def managed_folder(
    path: Path, kinds: tuple[str, ...] = (GOLDEN, ARTIFACTS), itself: bool = False
) -> Path | None:
    """The folder of one of `kinds` that `path` lies in (at any depth), or `path` itself with
    `itself`, if any. A folder whose manifest.json is some other tool's is not tconform's."""
    absolute = resolved(path)
    for folder in (absolute, *absolute.parents) if itself else absolute.parents:
        try:
            if manifest_kind(folder) in kinds:
                return folder
        except (UsageError, OSError):
            continue
    return None


def require_artifacts_folder(folder: Path) -> None:
    """Models go only into an artifacts folder: one with an artifacts manifest, or a new one;
    never into a golden folder, nor anywhere inside one."""
    golden = managed_folder(folder, (GOLDEN,), itself=True)
    if golden is not None:
        raise UsageError(
            f"{folder} is or lies in a golden folder ({golden / MANIFEST}); "
            "models go into an artifacts folder of their own (e.g. --out artifacts)"
        )


def require_replaceable_golden_folder(folder: Path) -> None:
    """`golden --force` replaces a golden folder, or fills an empty or missing one; never
    anything else, and never one inside another golden or artifacts folder."""
    outer = managed_folder(folder)
    if outer is not None:
        raise UsageError(
            f"{folder} lies in {outer}, a tconform golden or artifacts folder; goldens go into a "
            "folder of their own"
        )
    if not folder.exists():
        return
    if not folder.is_dir():
        raise UsageError(f"{folder}: exists and is not a folder")
    kind = manifest_kind(folder)
    if kind == GOLDEN:
        unlisted = files_not_listed(folder)
        if unlisted:
            raise UsageError(
                f"{folder / unlisted[0]}: not a file of the golden manifest; tconform replaces "
                "only the files it wrote (move it away first)"
            )
        return
    if kind is None and not any(folder.iterdir()):
        return
    what = "an artifacts folder" if kind == ARTIFACTS else "a folder that is not a golden folder"
    raise UsageError(f"{folder} is {what}; golden --force replaces only golden folders")


def files_not_listed(folder: Path) -> list[str]:
    """Files in a golden folder (relative paths) that its manifest does not list: someone
    else's, which replacing the folder would delete."""
    cases = read_json_manifest(folder / MANIFEST).get("cases")
    listed = {MANIFEST}
    for name, entry in (cases if isinstance(cases, dict) else {}).items():
        hashes = entry.get("sha256") if isinstance(entry, dict) else None
        listed.update(f"{name}/{rel}" for rel in (hashes if isinstance(hashes, dict) else {}))
    return sorted(files_under(folder) - listed)


def lock_path(folder: Path) -> Path:
    """The lock of a folder: a file beside it (`.NAME.lock`), since a golden folder is replaced
    as a whole by renaming and a file inside it would go with it."""
    return folder.parent / f".{folder.name}.lock"


def _open_lock(path: Path, shared: bool) -> int | None:
    """The lock file's descriptor, created if missing, never through a symlink (O_NOFOLLOW: a
    link planted at the lock's name would make tconform create or open its target, anywhere)
    and only if it is a regular file. None: a lock that cannot be created for a shared lock
    (a folder whose parent cannot be written is read without one)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(
                f"{path}: the lock's name is a symbolic link; tconform follows no link it did not "
                "make (remove it)"
            ) from None
        if shared and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return None
        raise UsageError(f"{path}: cannot create the lock ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"{path}: the lock's name is not a regular file; remove it")
    return fd


@contextlib.contextmanager
def folder_lock(folder: Path, shared: bool = False) -> Iterator[None]:
    """Hold the folder's lock: exclusive to write it, shared to read it. Concurrent runs on one
    folder wait for each other (saying so), and give up after TCONFORM_LOCK_TIMEOUT seconds.
    A folder whose parent cannot be written is read without a lock (no tconform can write
    there either)."""
    wait_s = value("TCONFORM_LOCK_TIMEOUT")
    path = lock_path(resolved(folder))
    fd = _open_lock(path, shared)
    if fd is None:
        yield
        return
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    deadline = time.monotonic() + wait_s
    told = False
    try:
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise UsageError(
                        f"{folder}: another tconform run holds {path}; gave up after "
                        f"{wait_s:g} s (TCONFORM_LOCK_TIMEOUT)"
                    ) from None
                if not told:
                    print(f"tconform: waiting for another run using {folder} ...", file=sys.stderr)
                    told = True
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)  # closing releases the lock
