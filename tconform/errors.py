"""Errors that end a command with one line and a documented exit code (see README, "Exit codes")."""

from __future__ import annotations

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


class ProviderUnavailable(TconformError):
    """An execution provider was requested but ONNX Runtime could not run it."""

    exit_code = EXIT_EP_UNAVAILABLE


class Terminated(BaseException):
    """SIGTERM, raised in the main thread (like KeyboardInterrupt for SIGINT) so that every
    `finally` runs: workers are stopped and nothing is left half-written."""
