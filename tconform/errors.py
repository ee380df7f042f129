"""Errors that end a command with one line and a documented exit code (see README, "Exit codes")."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1  # a conformance failure: some output is outside tolerance
EXIT_USAGE = 2  # bad arguments, missing or corrupt files, environment problems
EXIT_EP_UNAVAILABLE = 3  # a requested execution provider could not run (see --allow-missing-ep)


class TconformError(Exception):
    """An error the CLI prints as one line; `exit_code` says which of the codes above."""

    exit_code = EXIT_USAGE


class UsageError(TconformError):
    """Bad arguments, bad files or a broken environment."""


class ProviderUnavailable(TconformError):
    """An execution provider was requested but ONNX Runtime could not run it."""

    exit_code = EXIT_EP_UNAVAILABLE
