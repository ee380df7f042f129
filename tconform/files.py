"""Atomic file writes and hashing: nothing tconform writes is ever left half-written."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tconform.errors import Refused, UsageError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files readable by their owner only; the finished file gets the permissions
# any other new file would (0o666 less the umask).
_FILE_MODE = 0o666 & ~_umask()


def new_folder(parent: Path, prefix: str) -> Path:
    """A new folder of a unique name in `parent`, with the permissions mkdir gives (0o777 less
    the umask): one that is renamed into place (a golden folder, a bundle, an environment) must
    not keep mkdtemp's owner-only 0700."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(folder, 0o777 & ~_umask())
    return folder


# The folders this process holds a lock on (tconform.folders.folder_lock), each by its absolute
# path with the identity (device, inode) it had when locked.
_HELD: dict[Path, tuple[int, int]] = {}


def _identity(folder: Path) -> tuple[int, int] | None:
    """(device, inode) of `folder` itself, a real folder (not through a link), or None."""
    try:
        found = os.lstat(folder)
    except OSError:
        return None
    return (found.st_dev, found.st_ino) if stat.S_ISDIR(found.st_mode) else None


@contextlib.contextmanager
def held_as_locked(folder: Path) -> Iterator[None]:
    """While held, every write tconform makes under `folder`, and every model it reads there
    (require_unchanged), first checks that it is still the folder it was: one moved away
    mid-run, and another (a user's) put in its place, is never written into nor read as the
    run's own."""
    key = Path(os.path.abspath(folder))
    identity = _identity(key)
    if identity is None or key in _HELD:
        yield
        return
    _HELD[key] = identity
    try:
        yield
    finally:
        del _HELD[key]


def require_unchanged(path: Path) -> None:
    """Refused where `path` lies in a folder this process locked that is no longer the folder
    it locked (moved away, replaced, made a link): a write there would land among files
    tconform did not write, a read would take them for the run's own."""
    target = Path(os.path.abspath(path))
    for folder, identity in _HELD.items():
        if target.is_relative_to(folder) and _identity(folder) != identity:
            raise Refused(
                f"{folder}: no longer the folder this run locked (moved, replaced or made a "
                "link while it ran); tconform writes nothing into a folder it did not lock",
                folder,
            )


def printable(text: str) -> str:
    """`text` with each lone surrogate (an undecodable byte of a file name, a broken character
    in a message) as its escape sequence, so that it can be written as UTF-8 and drawn."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def atomic_write_text(path: Path, text: str) -> None:
    """`text` as UTF-8 at `path`, as atomic_write_bytes writes (lone surrogates escaped)."""
    atomic_write_bytes(path, printable(text).encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename it into place. A failure (a full
    disk, a folder that cannot be written) names `path` and leaves the old file as it was;
    so does a locked folder replaced under the run (require_unchanged)."""
    require_unchanged(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"{path}: cannot write it ({exc.strerror or exc})") from None
    except BaseException:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: object) -> None:
    atomic_write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


SHA256_DIGEST = re.compile(r"[0-9a-f]{64}")  # a sha256 as tconform records it


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    return sha256_bytes(path.read_bytes())


def files_under(folder: Path) -> set[str]:
    """Every file below `folder` (anything but a folder: a symlink, to a folder or dangling,
    included), as POSIX paths relative to it."""
    return {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_symlink() or not p.is_dir()
    }


def resolved(path: Path) -> Path:
    """`path` made absolute with its symlinks followed. A symlink loop (Path.resolve raises
    RuntimeError on one) or an unreadable link stays as named, made absolute, so that the
    caller's own check refuses it with a line instead of a traceback."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return Path(os.path.abspath(path))


UNOPENED = "which onnx and ONNX Runtime cannot open"


def require_utf8_name(path: Path, why: str = UNOPENED) -> Path:
    """`path`, if its name is UTF-8: onnx's checker and ONNX Runtime take paths as UTF-8 text
    and cannot open any other (onnx refuses it with an error about its own arguments); `why`
    says what else needs it."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise UsageError(f"{shown}: the name is not UTF-8, {why}; rename it") from None
    return path


# What tconform adds to a name when it writes beside it: atomic_write_bytes' temporary file
# (".NAME.XXXXXXXX.tmp", 14 more), a folder's lock (".NAME.lock"), its staging and retired
# copies (".NAME.staging-XXXXXXXX", 18 more, the longest). A name this much below the file
# system's limit can be written; a longer one would pass every check and then lose the file.
NAME_ROOM = 18
# What tconform writes inside a folder it is given, below it: a staged export
# (".tconform-staging/<case>.XXXXXXXX/model.onnx" and its temporary file), a golden's
# ".staging-XXXXXXXX/<case>/test_data_set_N/output_K.pb", a check's matrix cell
# ("matrix/<exporter>-opset<N>-<dtype>-<graph opt>/model.onnx"): all well under this.
INSIDE_ROOM = 160


def shown(path: Path | str, limit: int = 120) -> str:
    """A path for a one-line message, its middle left out when it is long."""
    text = os.fsdecode(path)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2 :]}"


def _limits(path: Path) -> tuple[int, int]:
    """(NAME_MAX, PATH_MAX) of the file system `path` would be on (its nearest existing folder's;
    Linux's 255 and 4096 where that cannot be asked)."""
    folder = Path(os.path.abspath(path))
    while not os.path.isdir(folder) and folder != folder.parent:
        folder = folder.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError):
        return 255, 4096


def require_name_fits(path: Path, room: int = NAME_ROOM, inside: int = 0) -> Path:
    """`path`, if the file system can hold it and what tconform writes beside it: every name in
    it at most NAME_MAX bytes, its own name `room` bytes less (see NAME_ROOM), the whole path
    below PATH_MAX with `inside` bytes to spare (a folder's, INSIDE_ROOM: what tconform writes
    in it); else one UsageError line, before anything opens it (the system's own refusal comes
    as an OSError from whichever call meets it first)."""
    name_max, path_max = _limits(path)
    absolute = os.fsencode(os.path.abspath(path))
    needed = max(room, inside)
    if len(absolute) + needed >= path_max:
        what = "in it" if inside > room else "beside it"
        beside = f", and tconform needs {needed} more for what it writes {what}" if needed else ""
        raise UsageError(
            f"{shown(path)}: a path of {len(absolute)} bytes; the file system takes paths below "
            f"{path_max} bytes{beside}"
        )
    parts = [os.fsencode(part) for part in Path(path).parts]
    for part in parts:
        if len(part) > name_max:
            raise UsageError(
                f"{shown(path)}: a name of {len(part)} bytes ({shown(os.fsdecode(part), 40)}); "
                f"the file system takes at most {name_max}"
            )
    if parts and len(parts[-1]) + room > name_max:
        raise UsageError(
            f"{shown(path)}: a name of {len(parts[-1])} bytes; tconform writes a temporary file "
            f"beside it first, so names it writes are at most {name_max - room} bytes"
        )
    return path


def require_inside(root: Path, path: Path) -> Path:
    """`path`, if it resolves inside `root`. A symlink (the file's, or a folder's on the way)
    that leads out of the folder is refused: tconform reads nothing outside the folders it is
    given."""
    if not resolved(path).is_relative_to(resolved(root)):
        raise UsageError(
            f"{path}: a symlink that leads outside {root}; tconform reads and writes only inside"
        )
    return path


MAX_REPORT_BYTES = 512 * 2**20  # far above a full matrix's report; refused before reading


# The largest integer a tconform file holds (sizes, counts, seeds): one beyond it (10**400)
# would overflow every float it is compared with.
MAX_JSON_INT = 2**63


class _Unheld(ValueError):
    """A JSON value no tconform file holds, saying which."""


def _bounded_int(text: str) -> int:
    value = int(text)
    if abs(value) > MAX_JSON_INT:
        raise _Unheld(f"the integer {text:.20}... is beyond {MAX_JSON_INT}")
    return value


def _why(exc: Exception) -> str:
    """What was wrong with a JSON file, briefly: what it holds that no tconform file does, or
    the exception's type."""
    if isinstance(exc, UnicodeEncodeError):
        return "a string holds a lone surrogate, which is no text"
    return str(exc) if isinstance(exc, _Unheld) else type(exc).__name__


def read_json_object(path: Path, max_bytes: int = MAX_REPORT_BYTES, what: str = "JSON") -> dict:
    """A JSON file holding an object, or one-line UsageError naming the file: a regular file
    (never a pipe, which would block), no larger than `max_bytes`, valid UTF-8 JSON."""
    if not path.is_file():
        raise UsageError(f"{path}: missing or not a regular file")
    size = path.stat().st_size
    if size > max_bytes:
        raise UsageError(f"{path}: {size} bytes, too large for a {what} file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_int=_bounded_int)
        # a lone surrogate (a valid JSON escape) is no text: it would fail every report written
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except (OSError, ValueError, RecursionError) as exc:  # undecodable, invalid, too deep
        raise UsageError(f"{path}: not a readable {what} file ({_why(exc)})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: not a tconform {what} file (a JSON object is expected)")
    return data
