"""The environment variables tconform reads, all named TCONFORM_*, each read and checked here.

A value is read when it is used (never when a module is imported, where a bad one would be a
traceback), and every command checks them all before it starts (`check_environment`): a bad
value, or a TCONFORM_* name tconform does not know (a misspelt one would be ignored silently),
is one line naming the variable, exit 2.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tconform.errors import UsageError

PREFIX = "TCONFORM_"

# ASCII digits with an optional fraction, at most nine before the point: float() also reads
# 'nan', 'inf', '1e999' and other scripts' digits.
_SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{0,9})?|\.[0-9]{1,9}")


def _seconds(text: str) -> float:
    if not _SECONDS.fullmatch(text):
        raise ValueError("a number of seconds >= 0 in ASCII digits (e.g. 900 or 0.5)")
    return float(text)


def _positive_seconds(text: str) -> float:
    if not _SECONDS.fullmatch(text) or float(text) <= 0:
        raise ValueError("a number of seconds > 0 in ASCII digits (e.g. 600 or 0.5)")
    return float(text)


def _folder(text: str) -> Path:
    if not text.strip() or "\0" in text:
        raise ValueError("a folder's path")
    path = Path(text)
    try:
        elsewhere = path.exists() and not path.is_dir()
    except OSError as exc:  # a name too long for the file system, say
        raise ValueError(f"a folder's path the system can take ({exc.strerror})") from None
    if elsewhere:
        raise ValueError("a folder; it names something else")
    return path.absolute()


@dataclass(frozen=True)
class Variable:
    name: str
    default: str | None  # None: unset means the reader's own default
    parse: Callable[[str], object]  # raises ValueError saying what a value must be
    help: str


VARIABLES = {
    v.name: v
    for v in (
        Variable(
            "TCONFORM_LOCK_TIMEOUT",
            "900",
            _seconds,
            "seconds a run waits for another run holding a folder's lock before it gives up "
            "(exit 2)",
        ),
        Variable(
            "TCONFORM_WORKER_TIMEOUT",
            "600",
            _positive_seconds,
            "seconds a runtime's worker process may take to answer one request before it is "
            "killed, its row a crash (tconform.runtimes.remote)",
        ),
        Variable(
            "TCONFORM_RUNTIME_CACHE",
            None,
            _folder,
            "the folder environments made for runtime releases are kept in "
            "[$XDG_CACHE_HOME/tconform/runtimes, else ~/.cache/tconform/runtimes] "
            "(tconform.runtimes.environments)",
        ),
    )
}


def value(name: str) -> object:
    """The variable's value (its default when it is unset; None where it has none), or a
    UsageError naming it."""
    variable = VARIABLES[name]
    text = os.environ.get(name)
    if text is None:
        return None if variable.default is None else variable.parse(variable.default)
    try:
        return variable.parse(text)
    except ValueError as exc:
        shown = repr(text) if len(text) <= 40 else repr(text[:40]) + "..."
        raise UsageError(f"environment variable {name}={shown}: must be {exc}") from None


def check_environment() -> None:
    """Every TCONFORM_* variable that is set: one tconform knows, holding a valid value."""
    for name in sorted(os.environ):
        if not name.startswith(PREFIX):
            continue
        if name not in VARIABLES:
            raise UsageError(
                f"environment variable {name}: not one tconform reads (it knows "
                f"{', '.join(VARIABLES)}); unset it or correct its name"
            )
        value(name)
