"""Folder roles: a golden folder and an artifacts folder are different things, and tconform never
writes one kind of file into the other kind of folder.

Each folder tconform writes holds a `manifest.json` that says what it is (`"kind"`; manifests
written before that field existed are recognised by their keys). A folder without a manifest is
nobody's: tconform writes into it only when it is empty or missing.

A folder tconform writes whole (a repro bundle) holds a marker file that names the tool and
lists every other file with its sha256: it is replaced only while it is exactly that, and goes
nowhere a golden or artifacts folder is (replace_whole).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path, PurePosixPath

from tconform.errors import Refused, UsageError
from tconform.files import (
    SHA256_DIGEST,
    atomic_write_json,
    files_under,
    held_as_locked,
    new_folder,
    read_json_object,
    resolved,
    sha256_file,
)
from tconform.variables import value

MANIFEST = "manifest.json"
# An artifacts folder's subfolders beside its case folders: tconform check's exports, the
# document checks' models, the bench's exports (a folder per preset and attention kernel) and
# the generation models (generation-fillN for another mask fill)
CHECK_AREA, DOC_AREA, BENCH_AREA, GENERATION_AREA = "check", "doc", "bench", "generation"
GOLDEN = "tconform-golden"
ARTIFACTS = "tconform-artifacts"
# tconform check's export folder: no manifest, its record check.json (tconform.check_folder)
CHECK_EXPORT, CHECK_RECORD, CHECK_TOOL = "tconform-check", "check.json", "tconform check"
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
    if kind is None and _written_models(data.get("models")):  # before "kind": its entries
        return ARTIFACTS
    raise UsageError(f"{path}: neither a golden nor an artifacts manifest")


def _written_models(models: object) -> bool:
    """Whether `models` is an artifacts manifest's, as tconform wrote them before manifests
    said their kind: one entry or more, each CASE/model.onnx with its sha256 (another tool's
    manifest with a "models" key is not taken for one)."""
    return (
        isinstance(models, dict)
        and bool(models)
        and all(
            isinstance(entry, dict)
            and entry.get("path") == f"{name}/model.onnx"
            and isinstance(entry.get("sha256"), str)
            for name, entry in models.items()
        )
    )


# A repro bundle (check --repro): no manifest; its marker, bundle.json, lists its files
REPRO_BUNDLE = "tconform-repro-bundle"
MANAGED = (GOLDEN, ARTIFACTS, CHECK_EXPORT, REPRO_BUNDLE)


def managed_folder(
    path: Path, kinds: tuple[str, ...] = MANAGED, itself: bool = False
) -> Path | None:
    """The folder of one of `kinds` that `path` lies in (at any depth), or `path` itself with
    `itself`, if any. A folder whose manifest.json is some other tool's is not tconform's."""
    absolute = resolved(path)
    for folder in (absolute, *absolute.parents) if itself else absolute.parents:
        try:
            if _folder_kind(folder) in kinds:
                return folder
        except (UsageError, OSError):
            continue
    return None


def _folder_kind(folder: Path) -> str | None:
    """GOLDEN or ARTIFACTS by its manifest, CHECK_EXPORT by check's record, or None."""
    kind = manifest_kind(folder)
    if kind is not None:
        return kind
    if _listed_files(folder, BUNDLE_MARKER, BUNDLE_TOOL) is not None:
        return REPRO_BUNDLE
    record = folder / CHECK_RECORD
    if record.is_symlink() or not record.is_file():
        return None
    data = read_json_object(record, MAX_MANIFEST_BYTES, "check record")
    return CHECK_EXPORT if data.get("tool") == CHECK_TOOL else None


def require_caches_apart(own: Sequence[Path] = ()) -> None:
    """The folders others write into while tconform runs nowhere in a golden or artifacts
    folder, nor in one of `own` (the run's own folders, which hold only what it lists: check's
    export folder): XDG_CACHE_HOME (the runtimes' environments go there), HOME (under which
    libraries keep their caches where XDG_CACHE_HOME is unset: matplotlib's font list, an ONNX
    Runtime whose telemetry the user turned on) and the temporary folder (TMPDIR: ONNX
    Runtime's session files, every temporary copy)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # every variable Python's tempfile reads: it passes over one it cannot use to the next
    given = {v: os.environ[v] for v in ("TMPDIR", "TEMP", "TMP", "HOME") if os.environ.get(v)}
    if xdg and Path(xdg).is_absolute():  # the XDG rule: a relative value is ignored
        given["XDG_CACHE_HOME"] = xdg
    for variable, folder in given.items():
        place = resolved(Path(folder))
        managed = managed_folder(Path(folder), itself=True) or next(
            (f for f in map(resolved, own) if place == f or f in place.parents), None
        )
        if managed is not None:
            raise UsageError(
                f"{variable}={folder!r:.200}: is or lies in {managed}, a folder tconform keeps "
                "its own files in (golden, artifacts or export); tconform and the libraries it "
                "runs write temporary files and caches there (name a folder of its own)"
            )


def require_not_link(folder: Path, what: str) -> None:
    """A folder tconform writes into is never a symbolic link, nor, for a relative path, one of
    the folders below the current one on the way to it (check's default artifacts/check/NAME
    through a planted artifacts/check link): tconform follows no link it did not make (the
    user names the folder it leads to). `what`: the option or variable naming it."""
    steps = [folder, *folder.parents][:-1] if not folder.is_absolute() else [folder]
    for step in steps:
        if step.is_symlink():
            raise Refused(
                f"{step}: a symbolic link ({what}); tconform writes through no link it did not "
                "make (name the folder it leads to)",
                step,
            )


def require_artifacts_folder(folder: Path) -> None:
    """Models go only into an artifacts folder: one with an artifacts manifest, or a new one;
    never into a golden folder or check's export folder, nor anywhere inside one."""
    other = managed_folder(folder, (GOLDEN, CHECK_EXPORT), itself=True)
    if other is not None:
        what = "a golden folder" if manifest_kind(other) == GOLDEN else "check's export folder"
        raise UsageError(
            f"{folder} is or lies in {what} ({other}); models go into an artifacts folder of "
            "their own (export --out DIR, verify --artifacts DIR)"
        )


def require_replaceable_golden_folder(folder: Path) -> None:
    """`golden --force` replaces a golden folder, or fills an empty or missing one; never
    anything else, and never one inside another golden or artifacts folder."""
    outer = managed_folder(folder)
    if outer is not None:
        raise UsageError(
            f"{folder} lies in {outer}, a tconform golden, artifacts or check export folder; "
            "goldens go into a folder of their own"
        )
    if folder.is_symlink():  # replaced by renaming, the link would become a folder
        raise UsageError(
            f"{folder}: a symbolic link; goldens are written into a folder of their own (name "
            "the folder it leads to)"
        )
    require_not_link(folder, "the golden folder")  # nor through one on the way to it
    if not folder.exists():
        return
    if not folder.is_dir():
        raise UsageError(f"{folder}: exists and is not a folder")
    kind = manifest_kind(folder)
    if kind == GOLDEN:
        unlisted = files_not_listed(folder)
        if unlisted:
            raise UsageError(
                f"{folder / unlisted[0]}: not listed in the golden manifest; tconform replaces "
                "only the files it wrote (move it away first)"
            )
        return
    if kind is None and not any(folder.iterdir()):
        return
    what = "an artifacts folder" if kind == ARTIFACTS else "a folder that is not a golden folder"
    raise UsageError(f"{folder} is {what}; golden --force replaces only golden folders")


def files_not_listed(folder: Path) -> list[str]:
    """Files in a golden folder (relative paths) that its manifest does not list, and folders
    that hold none it lists (an empty one included): someone else's, which replacing the
    folder would delete."""
    cases = read_json_manifest(folder / MANIFEST).get("cases")
    listed = {MANIFEST}
    for name, entry in (cases if isinstance(cases, dict) else {}).items():
        hashes = entry.get("sha256") if isinstance(entry, dict) else None
        listed.update(f"{name}/{rel}" for rel in (hashes if isinstance(hashes, dict) else {}))
    holding = {parent.as_posix() for rel in listed for parent in PurePosixPath(rel).parents}
    folders = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_dir()}
    folders -= files_under(folder)  # a link to a folder is a file here
    return sorted((files_under(folder) - listed) | (folders - holding))


# --- folders tconform writes whole --------------------------------------------------------------

MAX_MARKER_BYTES = 2**20  # a marker lists a few files
BUNDLE_MARKER = "bundle.json"  # a repro bundle's marker (tconform.localise.isolate writes it)
BUNDLE_TOOL = "tconform check --repro"
# What earlier releases wrote as the marker's tool: their bundles are still tconform's own.
_EARLIER_TOOLS = {BUNDLE_TOOL: ("tconform localise --repro",)}


def _listed_files(folder: Path, marker: str, tool: str) -> dict[str, str] | None:
    """What `folder`'s marker lists (relative path -> sha256), or None where the marker is not
    tconform's: not a regular file, not JSON, another tool's, or listing anything but plain
    relative paths below the folder with sha256 digests."""
    path = folder / marker
    if path.is_symlink() or not path.is_file():
        return None
    try:
        data = read_json_object(path, MAX_MARKER_BYTES, what="marker")
    except UsageError:
        return None
    files = data.get("files")
    if data.get("tool") not in (tool, *_EARLIER_TOOLS.get(tool, ())) or not isinstance(files, dict):
        return None
    for rel, digest in files.items():
        name = PurePosixPath(rel)
        if (
            not (isinstance(digest, str) and SHA256_DIGEST.fullmatch(digest))
            or name.is_absolute()
            or name.as_posix() != rel
            or {"..", "."} & set(name.parts)
            or rel == marker
        ):
            return None
    return files


def not_written_whole(folder: Path, marker: str, tool: str) -> str | None:
    """What keeps `folder` from being as `tool` wrote it (None: nothing): its marker must list
    every other file it holds, each with the sha256 it has; no symlink, no other kind of file,
    nothing added or changed."""
    listed = _listed_files(folder, marker, tool)
    if listed is None:
        return f"{folder / marker}: missing, or not written by {tool}"
    found, parents = set(), {p.as_posix() for rel in listed for p in PurePosixPath(rel).parents}
    for top, folders, names in os.walk(folder):
        for name in (*folders, *names):
            path = Path(top) / name
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                return f"{path}: a symbolic link or special file, which {tool} never writes"
        found |= {(Path(top) / name).relative_to(folder).as_posix() for name in names}
        for name in folders:
            if (Path(top) / name).relative_to(folder).as_posix() not in parents:
                return f"{Path(top) / name}: a folder {tool} did not write there"
    unlisted = sorted(found - {*listed, marker})
    if unlisted:
        return f"{folder / unlisted[0]}: not a file {tool} wrote there"
    for rel, digest in listed.items():
        if rel not in found or sha256_file(folder / rel) != digest:
            return f"{folder / rel}: missing or changed since {tool} wrote it"
    return None


def require_new_or_written_whole(folder: Path, marker: str, tool: str, option: str) -> None:
    """A folder written whole goes only where it loses nothing: a new or empty folder, or one
    `tool` wrote and that is as it was written (not_written_whole). Never a symlink (it would
    become a folder), never in a golden or artifacts folder, never the current folder or one
    above it. A Refused line naming `option` otherwise."""
    if folder.is_symlink():
        raise Refused(f"{folder}: a symbolic link; {option} writes a folder of its own", folder)
    require_not_link(folder, option)  # nor through one on the way to it
    if folder.exists() and not folder.is_dir():
        raise Refused(f"{folder}: exists and is not a folder ({option})", folder)
    if Path.cwd().is_relative_to(resolved(folder)):  # not Refused: reports may go below it
        raise UsageError(
            f"{folder}: the current folder, or one above it; {option} needs a folder of its own"
        )
    # (a folder written whole by `tool` may be this one: whether it is as written is below)
    managed = managed_folder(folder, (GOLDEN, ARTIFACTS, CHECK_EXPORT), itself=True)
    if managed is not None:
        raise Refused(
            f"{folder} is or lies in a golden, artifacts or check export folder ({managed}); "
            f"{option} needs a folder of its own",
            folder,
        )
    inside = next(
        (p for p in resolved(folder).parents if _listed_files(p, marker, tool) is not None), None
    )
    if inside is not None:  # writing there changes that folder; replacing it takes this one
        raise Refused(
            f"{folder}: lies in {inside}, a folder {tool} wrote; {option} needs a folder of its "
            "own",
            folder,
        )
    problem = not_written_whole(folder, marker, tool) if folder.is_dir() else None
    if problem is not None and any(folder.iterdir()):
        raise Refused(
            f"{problem}; {option} replaces only a folder tconform wrote, as it wrote it (name a "
            "new folder, or move this one away)",
            folder,
        )


def replace_whole(
    folder: Path, marker: str, record: dict, write: Callable[[Path], None], option: str
) -> Path:
    """Write a folder whole: `write(staging)` fills a new folder beside `folder`, the marker is
    added (`record`, which names the tool, and every file's sha256), and the new folder takes
    `folder`'s place once require_new_or_written_whole has allowed it again (the run that made
    its contents took a while). Nothing is left half written, and an earlier folder is removed
    only once the new one is in its place."""
    given, folder = folder, Path(os.path.abspath(folder))  # abspath: `.name` of "a/.." is ".."
    require_new_or_written_whole(folder, marker, record["tool"], option)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = new_folder(folder.parent, f".{folder.name}.")
    try:
        write(staging)
        files = {rel: sha256_file(staging / rel) for rel in sorted(files_under(staging))}
        atomic_write_json(staging / marker, {**record, "files": files})
        require_new_or_written_whole(folder, marker, record["tool"], option)
        if not folder.exists():
            os.replace(staging, folder)
            return given
        retired = Path(tempfile.mkdtemp(prefix=f".{folder.name}.retired-", dir=folder.parent))
        try:
            os.replace(folder, retired / folder.name)
            try:
                os.replace(staging, folder)
            except OSError:
                os.replace(retired / folder.name, folder)  # the earlier folder, back
                raise
        finally:
            shutil.rmtree(retired, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return given


def lock_path(folder: Path) -> Path:
    """The lock of a folder: a file beside it (`.NAME.lock`), since a golden folder is replaced
    as a whole by renaming and a file inside it would go with it."""
    return folder.parent / f".{folder.name}.lock"


def is_lock(path: Path) -> bool:
    """Whether `path` is a folder's lock as tconform makes it: a regular file `.NAME.lock`."""
    name = path.name
    return (
        name.startswith(".") and name.endswith(".lock") and path.is_file() and not path.is_symlink()
    )


def open_lock(path: Path, shared: bool = False) -> int | None:
    """The lock file's descriptor, created by a writer if missing, never through a symlink
    (O_NOFOLLOW: a link planted at the lock's name would make tconform create or open its
    target, anywhere) and only if it is a regular file. None: a shared lock with no lock file
    to take (or one that cannot be opened): the folder is read without one."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        # a reader takes the lock its writer left, never making one beside a folder it reads
        fd = os.open(path, flags if shared else flags | os.O_CREAT, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(
                f"{path}: the lock's name is a symbolic link; tconform follows no link it did not "
                "make (remove it)"
            ) from None
        if shared:  # no lock file (no writer made one), or one that cannot be opened
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
    A reader never creates the lock: a folder no tconform run has written (a copy, a folder
    whose parent cannot be written) is read without one, its files checked by their sha256."""
    wait_s = value("TCONFORM_LOCK_TIMEOUT")
    path = lock_path(resolved(folder))
    fd = open_lock(path, shared)
    if fd is None:  # read without a lock, but still as this folder or nothing
        with held_as_locked(folder):
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
        with held_as_locked(folder):  # read or written, it is this folder or nothing
            yield
    finally:
        os.close(fd)  # closing releases the lock
