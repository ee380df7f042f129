"""Errors that end a command with one line and a documented exit code (see README, "Exit codes")."""

from __future__ import annotations

import contextlib
import os
import re
import signal
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


class RuntimeTooOld(TconformError):
    """A runtime release that cannot read the model at all (an IR version newer than it knows:
    ONNX Runtime 1.17 reads IR 9 at most). A fact about the release, like KernelMissing: every
    command reports it as `skip` with this message, and the other runtimes run."""


class RuntimeRejected(Exception):
    """A runtime that cannot convert or load a model that is well-formed ONNX (a translation
    bug, an op its release does not know). The runtime's failure on that model: a row of
    status error naming it, never a usage error that ends the run for every other runtime."""


class WorkerCrashed(Exception):
    """A runtime's worker process (tconform.runtimes.remote) crashed, hung past its timeout or
    was killed while it ran or opened a model. The runtime's failure, not the user's: a result
    of its own kind (Status.CRASH, a conformance failure, exit 1) naming how it ended; never a
    TconformError, so no command takes it for a usage error."""

    # Set where a session's run crashed it (tconform.runtimes.remote.RemoteSession): the model
    # it ran and its feeds (None where some stayed in the worker: a cache's handles)
    model_path: Path | None = None
    feeds: dict | None = None
    # Set where bench's engine crashed opening its model: what the row ran (tconform.bench)
    details: dict | None = None


# The runtimes' native calls under way, each in a helper thread (tconform.execution.
# interruptible) that removes its own when the call returns. One left when a signal ends the
# run never returned (a graph that loops for ever): the process then leaves without waiting
# for it, since the runtime's threads would abort its exit. (Not Thread.is_alive: a join that
# a signal interrupts marks the thread stopped while it runs on, CPython bpo-45274.)
NATIVE_CALLS: set[object] = set()


def native_call_left() -> bool:
    """Whether a runtime's native call is still running, abandoned by a signal."""
    return bool(NATIVE_CALLS)


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
        return f"called sys.exit({_capped(repr(exc.code))})"
    try:
        text = str(exc).strip()
    except Exception as unreadable:  # a user's __str__ that raises names the error it hid
        return f"{type(exc).__name__} (its message raised {type(unreadable).__name__})"
    if not text:
        return type(exc).__name__
    lines = text.splitlines()
    more = f" ({len(lines) - 1} lines more)" if len(lines) > 1 else ""
    return f"{type(exc).__name__}: {_capped(lines[0])}{more}"


LINE_CHARACTERS = 1000  # of a message that is not tconform's own: a line, not a page


def _capped(text: str) -> str:
    """`text` cut to LINE_CHARACTERS, saying how much was left out."""
    if len(text) <= LINE_CHARACTERS:
        return text
    return f"{text[:LINE_CHARACTERS]}... ({len(text) - LINE_CHARACTERS} characters more)"


@contextlib.contextmanager
def calling_user_code(what: str) -> Iterator[None]:
    """Around code tconform calls but did not write (a factory, a module's forward, its
    export): whatever it raises, sys.exit and GeneratorExit included, becomes one UsageError
    line naming `what`; only Ctrl-C and SIGTERM pass through, to end the run as signals do.
    A working folder it changed is changed back: the paths the user gave (--out, --repro) are
    relative to the folder tconform started in, never to one the module's code moved to."""
    folder = _working_folder()
    try:
        yield
    except KeyboardInterrupt as exc:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # no Ctrl-C reaches this process
            raise EndedByUserCode(f"{what}: raised KeyboardInterrupt itself") from exc
        raise
    except Terminated:
        raise
    except TconformError:
        raise
    except Exception as exc:
        raise UsageError(f"{what}: {first_line(exc)}") from None
    except BaseException as exc:  # SystemExit, GeneratorExit: the code ended itself
        raise EndedByUserCode(f"{what}: {first_line(exc)}") from None
    finally:
        if folder is not None and _working_folder() != folder:
            with contextlib.suppress(OSError):
                os.chdir(folder)


def _working_folder() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # removed under the process
        return None


_SIGNALS = {getattr(signal, name): name for name in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE",
            "SIGABRT", "SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGPIPE")}  # fmt: skip


def how_it_ended(exitcode: int | None) -> str:
    """A child process's end, in words: its exit status, or the signal that killed it (a
    check's child, tconform.child; a runtime's worker, tconform.runtimes.remote)."""
    if exitcode is None:
        return "did not end"
    if exitcode >= 0:
        return f"exited with status {exitcode}"
    name = _SIGNALS.get(-exitcode, f"signal {-exitcode}")
    if -exitcode == signal.SIGKILL:
        return f"was killed ({name}: the kernel's out-of-memory killer, or kill -9)"
    if -exitcode in (signal.SIGSEGV, signal.SIGBUS):
        return f"crashed ({name}: a segmentation fault in native code)"
    if -exitcode == signal.SIGABRT:
        return f"crashed ({name}: native code called abort)"
    return f"was killed by {name}"


# Control characters and what str.splitlines() breaks at (a file or case name can hold them).
_LINE_BREAKING = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` as one line: each control or line-breaking character written as its escape
    (a newline in a file's name is `\\n`), so that an error stays the one line it is."""
    return _LINE_BREAKING.sub(lambda found: found.group().encode("unicode_escape").decode(), text)
