"""Atomic file writes and hashing: nothing tconform writes is ever left half-written."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from tconform.errors import UsageError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files readable by their owner only; the finished file gets the permissions
# any other new file would (0o666 less the umask).
_FILE_MODE = 0o666 & ~_umask()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename it into place. A failure (a full
    disk, a folder that cannot be written) names `path` and leaves the old file as it was."""
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


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    return sha256_bytes(path.read_bytes())


def files_under(folder: Path) -> set[str]:
    """Every file below `folder` (anything but a folder, a dangling symlink included), as POSIX
    paths relative to it."""
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()}


def resolved(path: Path) -> Path:
    """`path` made absolute with its symlinks followed. A symlink loop (Path.resolve raises
    RuntimeError on one) or an unreadable link stays as named, made absolute, so that the
    caller's own check refuses it with a line instead of a traceback."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return Path(os.path.abspath(path))


def require_utf8_name(path: Path) -> Path:
    """`path`, if its name is UTF-8: onnx's checker and ONNX Runtime take paths as UTF-8 text
    and cannot open any other (onnx refuses it with an error about its own arguments)."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise UsageError(
            f"{shown}: the name is not UTF-8, which onnx and ONNX Runtime cannot open; rename it"
        ) from None
    return path


def require_inside(root: Path, path: Path) -> Path:
    """`path`, if it resolves inside `root`. A symlink (the file's, or a folder's on the way)
    that leads out of the folder is refused: tconform reads nothing outside the folders it is
    given."""
    if not resolved(path).is_relative_to(resolved(root)):
        raise UsageError(f"{path}: a symlink that leads outside {root}; tconform reads only inside")
    return path


MAX_REPORT_BYTES = 512 * 2**20  # far above a full matrix's report; refused before reading


def read_json_object(path: Path, max_bytes: int = MAX_REPORT_BYTES, what: str = "JSON") -> dict:
    """A JSON file holding an object, or one-line UsageError naming the file: a regular file
    (never a pipe, which would block), no larger than `max_bytes`, valid UTF-8 JSON."""
    if not path.is_file():
        raise UsageError(f"{path}: missing or not a regular file")
    size = path.stat().st_size
    if size > max_bytes:
        raise UsageError(f"{path}: {size} bytes, too large for a {what} file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # undecodable, invalid, too deep
        raise UsageError(f"{path}: not a readable {what} file ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: not a tconform {what} file (a JSON object is expected)")
    return data
