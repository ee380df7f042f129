"""Errors that end a command with one line and a documented exit code (see README, "Exit codes")."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

EXIT_OK = 0
EXIT_FAILURE = 1  # a conformance failure: some output is outside tolerance
EXIT_USAGE = 2  # bad arguments, missing or corrupt files, environment problems
EXIT_EP_UNAVAILABLE = 3  # a requested execution provider could not run (see --allow-missing-ep)
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as shells report it
EXIT_TERMINATED = 143  # SIGTERM


class TconformError(Exception):
    """An error the CLI prints as one line; `exit_code` says which of the codes above."""

    exit_code = EXIT_USAGE

    @classmethod
    def with_code(cls, message: str, exit_code: int) -> TconformError:
        error = cls(message)
        error.exit_code = exit_code
        return error


class UsageError(TconformError):
    """Bad arguments, bad files or a broken environment."""


class Refused(UsageError):
    """A usage error that refuses to write at `path` (a folder or file that is not tconform's
    to replace, or one the run reads): no report is written at or below it either, not even
    the one that says why."""

    def __init__(self, message: str, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class ProviderUnavailable(TconformError):
    """An execution provider was requested but ONNX Runtime could not run it."""

    exit_code = EXIT_EP_UNAVAILABLE


class KernelMissing(TconformError):
    """A runtime has no kernel for an op at the model's element type (ONNX Runtime's
    NOT_IMPLEMENTED, say). Not a conformance failure: every command reports it as `skip` with
    this message."""

    def __init__(self, runtime: str, op_type: str, dtype: str) -> None:
        super().__init__(f"{runtime} has no {dtype} kernel for {op_type}")
        self.runtime = runtime
        self.op_type = op_type
        self.dtype = dtype


class Terminated(BaseException):
    """SIGTERM, raised in the main thread (like KeyboardInterrupt for SIGINT) so that every
    `finally` runs: workers are stopped and nothing is left half-written."""


class EndedByUserCode(UsageError):
    """User code ended what tconform called it for (sys.exit, GeneratorExit): one line, never
    retried another way (--exporter auto does not fall back to TorchScript after it)."""


def first_line(exc: BaseException) -> str:
    """One line for an exception: its type and the first line of its message. SystemExit is
    named as what it is (a call of sys.exit), never obeyed."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


@contextlib.contextmanager
def calling_user_code(what: str) -> Iterator[None]:
    """Around code tconform calls but did not write (a factory, a module's forward, its
    export): whatever it raises, sys.exit and GeneratorExit included, becomes one UsageError
    line naming `what`; only Ctrl-C and SIGTERM pass through, to end the run as signals do."""
    try:
        yield
    except (KeyboardInterrupt, Terminated):
        raise
    except TconformError:
        raise
    except Exception as exc:
        raise UsageError(f"{what}: {first_line(exc)}") from None
    except BaseException as exc:  # SystemExit, GeneratorExit: the code ended itself
        raise EndedByUserCode(f"{what}: {first_line(exc)}") from None


# Control characters and what str.splitlines() breaks at (a file or case name can hold them).
_LINE_BREAKING = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` as one line: each control or line-breaking character written as its escape
    (a newline in a file's name is `\\n`), so that an error stays the one line it is."""
    return _LINE_BREAKING.sub(lambda found: found.group().encode("unicode_escape").decode(), text)
