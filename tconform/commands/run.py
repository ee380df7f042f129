"""The frame every checking command shares (verify, check, doc, bench, report merge): run, always
write the requested reports (also when the run stops early on an input error, a file that cannot
be read or a signal, with the results so far and an `error` entry), print the table, and exit
with the one rule of `tconform.results.exit_code`.

A usage error that click raises before a command starts (an unknown option, a bad value) still
gets the reports the command line asked for (`write_error_reports`), read from the arguments
without click's parser, so that nothing placed before `--json FILE` can hide it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import click

from tconform.errors import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    Refused,
    TconformError,
    Terminated,
    WorkerCrashed,
    one_line,
)
from tconform.files import resolved
from tconform.report.formats import is_own_report
from tconform.results import nothing_checked

RUN_REPORT = "tconform.report:RunReport"
# Whether the frame has written this command's reports (tconform.cli.main resets it): an error
# that ends the command afterwards must not replace them with a report of the error alone.
reports_written = False


# The Ctrl-C and SIGTERM this process received (the handlers below record each before they
# raise): Python swallows an exception raised inside a weakref callback or a __del__
# ("Exception ignored in ..."), and a run whose signal landed there went on to exit 0. The
# frame raises a recorded signal again at the next progress line and when the run returns.
received: list[int] = []


def on_signal(signum: int, _frame) -> None:
    received.append(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def quiet_unraisable(unraisable) -> None:
    """sys.unraisablehook: a signal's exception that Python swallowed (raised inside a weakref
    callback or a finaliser) is recorded in `received` and raised again at the next progress
    line, so it is not printed as a traceback; anything else goes to Python's own hook."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt | Terminated) and received:
        return
    sys.__unraisablehook__(unraisable)


def raise_received() -> None:
    """The first signal this process received, raised again (nothing where none came), in
    the main thread, where the handlers raised it."""
    if received and threading.current_thread() is threading.main_thread():
        on_signal(received[0], None)


def progress_printer(quiet: bool) -> Callable[[str], None]:
    return (lambda _: None) if quiet else (lambda line: click.echo(one_line(line), err=True))


def describe_os_error(exc: OSError) -> str:
    """One line for a file that cannot be read or written: the file, then why."""
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


def run_and_report(
    report,
    run: Callable,
    quiet: bool,
    reports: Mapping[str, Path | None],
    render: Callable | None = None,
) -> None:
    """`run(report, progress)` fills `report` (a RunReport, or another kind of report with
    `error`, `exit_code`, `environment`, `render()` and `summary()`); this writes every report
    of `reports` (format -> path, tconform.report.formats) and exits. Whatever ends the run, the
    reports are written first: a TconformError, a click usage error, a file that cannot be read,
    memory running out, Ctrl-C and SIGTERM each become the `error` entry.

    A report replaces only a report of its own kind that tconform wrote: a path that holds
    anything else (the user's notes, the inputs file this run reads) is refused before the run
    starts, and the other reports say so."""
    from tconform.report import RunReport, write_reports
    from tconform.report.environment import environment, utc_now
    from tconform.runtimes.environments import announced_to

    started = utc_now()
    interrupted: BaseException | None = None
    reports = dict(reports)
    try:
        _refuse_foreign_reports(report, reports)
        printer = progress_printer(quiet)

        def progress(line: str) -> None:
            raise_received()
            printer(line)

        with announced_to(progress):  # a runtime release's environment being made, too
            run(report, progress)
        raise_received()
    except _ENDINGS as exc:
        report.error = ended_by(exc)
        if isinstance(exc, TconformError):
            reports = {fmt: path for fmt, path in reports.items() if outside_refused(path, exc)}
        if isinstance(exc, _SIGNALLED):
            interrupted = exc
    # The first signal decides: a second Ctrl-C or SIGTERM waits until the reports are written.
    with ignored_signals() if interrupted is not None else contextlib.nullcontext():
        if not report.environment:  # a run's settings say the threads it gave its runtimes
            threads = report.settings.get("threads") if isinstance(report, RunReport) else None
            report.environment = environment(started, threads)
        text = render(report) if render is not None else report.render()
        if text:
            click.echo(text)
        lost = _stdout_lost()
        if lost and report.error is None:  # the reports say what the process's exit says
            report.error = {"message": lost, "exit_code": report.exit_code or EXIT_USAGE}
        global reports_written
        reports_written = True  # even if writing fails: what it could not write stays unwritten
        failed = write_reports(report, reports)
        if failed and report.error is None:  # the others say so, and the exit too
            report.error = {"message": "; ".join(failed.values()), "exit_code": EXIT_USAGE}
            write_reports(report, {f: p for f, p in reports.items() if f not in failed})
        elif failed:  # the run's own error stays the last line
            for line in failed.values():
                click.echo(f"tconform: error: {one_line(line)}", err=True)
    if interrupted is not None:
        raise interrupted  # the CLI's one line and exit code for a signal
    if report.error is not None:
        raise TconformError.with_code(str(report.error["message"]), report.exit_code)
    _summarise(report)
    raise SystemExit(report.exit_code)


def _stdout_lost() -> str:
    """'' while stdout takes what is written; else its one line (`>/dev/full`: what was
    printed is lost, and the process ends with an error: tconform.cli.ForgivingStdout)."""
    sys.stdout.flush()
    lost = getattr(sys.stdout, "error", None)
    return f"stdout: {lost.strerror}" if lost is not None else ""


# What can end a run before its reports are written: each becomes the report's `error`.
_SIGNALLED = (KeyboardInterrupt, click.exceptions.Abort, Terminated)
_ENDINGS = (TconformError, click.ClickException, OSError, WorkerCrashed, MemoryError, *_SIGNALLED)


def ended_by(exc: BaseException) -> dict[str, object]:
    """The `error` entry of a run that `exc` ended: its one line and exit code."""
    if isinstance(exc, TconformError):
        return {"message": str(exc), "exit_code": exc.exit_code}
    if isinstance(exc, click.ClickException):
        return {"message": exc.format_message(), "exit_code": exc.exit_code}
    if isinstance(exc, OSError):  # a file that cannot be read or written: named, exit 2
        return {"message": describe_os_error(exc), "exit_code": EXIT_USAGE}
    if isinstance(exc, WorkerCrashed):  # a runtime's worker died where no row could take it
        return {"message": str(exc), "exit_code": EXIT_FAILURE}
    if isinstance(exc, MemoryError):
        return {"message": "out of memory (try a smaller shape or preset)", "exit_code": EXIT_USAGE}
    if isinstance(exc, Terminated):
        return {"message": "terminated", "exit_code": EXIT_TERMINATED}
    return {"message": "interrupted", "exit_code": EXIT_INTERRUPTED}


def _refuse_foreign_reports(report, reports: dict[str, Path | None]) -> None:
    """A report path that holds anything but this kind's own report is refused (and left out
    of the reports written)."""
    for fmt, path in list(reports.items()):
        if path is not None and os.path.lexists(path) and not is_own_report(report, fmt, path):
            reports[fmt] = None
            raise click.UsageError(
                f"{path}: exists and is not a {fmt} report tconform wrote; tconform "
                "replaces only its own reports (name a new file, or remove it)"
            )


def _summarise(report) -> None:
    """The summary line of a run that ended; one that checked nothing says why on stderr too
    (under -q, it is all a CI log shows). Its reports hold every result and exit code 3 (not an
    `error`: it was not stopped, and `report merge` judges a shard whose every unit skipped as
    part of the whole run)."""
    summary = report.summary()
    if summary:
        click.echo(summary)
    results = getattr(report, "results", None)
    if results and nothing_checked(r.status for r in results):
        why = next((r.message for r in results if r.message), "every result was skipped")
        click.echo(f"tconform: error: nothing checked: {one_line(why)}", err=True)


SIGNALS = (signal.SIGINT, signal.SIGTERM)


def ignore_signals() -> None:
    """Ctrl-C and SIGTERM ignored from here on (in the main thread, where handlers live)."""
    if threading.current_thread() is threading.main_thread():
        for number in SIGNALS:
            signal.signal(number, signal.SIG_IGN)


@contextlib.contextmanager
def ignored_signals() -> Iterator[None]:
    """Ctrl-C and SIGTERM ignored inside the block, their handlers restored after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.getsignal(number) for number in SIGNALS}
    ignore_signals()
    try:
        yield
    finally:
        for number, handler in previous.items():
            if handler is not None:  # None: not installed from Python, nothing to restore
                signal.signal(number, handler)


def outside_refused(path: Path | None, error: BaseException) -> Path | None:
    """`path`, unless it lies at or below what `error` refused to write (errors.Refused): a
    report goes nowhere the command refused, not even to say why."""
    refused = getattr(error, "path", None) if isinstance(error, Refused) else None
    if path is None or refused is None:
        return path
    return None if resolved(path).is_relative_to(resolved(refused)) else path


def writes_report(name: str, kind: str = RUN_REPORT):
    """Mark a command whose reports are `kind` reports (a "module:Class" made with `name`), so
    that a usage error that stops click before the command starts still gets them written
    (write_error_reports)."""

    def mark(command: click.Command) -> click.Command:
        command.report_name = name  # type: ignore[attr-defined]
        command.report_kind = kind  # type: ignore[attr-defined]
        return command

    return mark


def write_error_reports(
    group: click.Group, argv: list[str], message: str, code: int, error: BaseException | None = None
) -> None:
    """The reports `argv` asked for, holding only the error entry of a usage error that click
    raised before the command ran (`--exporter nosuch`, a missing argument). A report is written
    only where its path passes its option's own checks and replaces nothing but a report of its
    kind that tconform wrote, never a file or folder that `argv` names otherwise, and never at
    or below what `error` refused (outside_refused)."""
    import importlib

    from tconform.commands.options import ReportPath
    from tconform.report.environment import environment, utc_now
    from tconform.report.formats import FORMATS

    command, rest = _leaf_command(group, argv)
    kind = getattr(command, "report_kind", None)
    if command is None or kind is None:
        return
    module, _, cls = kind.partition(":")
    report = getattr(importlib.import_module(module), cls)(command.report_name)
    report.error = {"message": message, "exit_code": code}
    asked: dict[str, Path] = {}
    for fmt, value in report_arguments(command, rest).items():
        with contextlib.suppress(click.BadParameter):  # a path its option refuses: not written
            path = ReportPath(FORMATS[fmt].suffix).convert(value, None, None)
            if outside_refused(path, error) is not None:
                asked[fmt] = path
    named = _paths_named(argv)
    targets = [resolved(path) for path in asked.values()]
    paths = {}
    for fmt, path in asked.items():
        if (
            targets.count(resolved(path)) == 1  # two reports named one file: neither
            and _replaceable(path, report, fmt, named)
        ):
            paths[fmt] = path
    if paths:
        report.environment = environment(utc_now())
        # The usage error stays the one line shown, even if a report cannot be written.
        with contextlib.suppress(TconformError, OSError):
            from tconform.report import write_reports

            write_reports(report, paths)


def report_arguments(command: click.Command, args: list[str]) -> dict[str, str]:
    """The report options (tconform.report.formats) in `args`, read as click would read them but
    without its parser, so that an unknown option or a bad value before `--json FILE` does not
    hide it: each known option takes its own number of values, anything else one token. A
    format given twice is a usage error of its own (report_options), and neither file is
    written: which one the user meant is not known."""
    from tconform.report.formats import FORMATS

    takes: dict[str, int] = {}
    for param in command.params:
        if isinstance(param, click.Option):
            count = 0 if param.is_flag or param.count else max(param.nargs, 1)
            for opt in (*param.opts, *param.secondary_opts):
                takes[opt] = count
    flags = {spec.flag: fmt for fmt, spec in FORMATS.items() if spec.flag in takes}
    found: dict[str, str] = {}
    twice: set[str] = set()
    at = 0
    while at < len(args):
        token = args[at]
        if token == "--":  # everything after it is an argument
            break
        name, equals, value = token.partition("=")
        if token.startswith("--") and equals:
            given = (name, value) if name in flags else None
            at += 1
        elif token in flags:
            given = (token, args[at + 1]) if at + 1 < len(args) else None
            at += 2
        else:
            given = None
            at += 1 + takes.get(token, 0)
        if given is not None:
            fmt = flags[given[0]]
            if fmt in found:
                twice.add(fmt)
            found[fmt] = given[1]
    return {fmt: path for fmt, path in found.items() if fmt not in twice}


def _leaf_command(group: click.Group, argv: list[str]) -> tuple[click.Command | None, list]:
    """The subcommand `argv` names (through nested groups) and the arguments left for it."""
    command: click.Command | None = group
    rest = list(argv)
    while isinstance(command, click.Group):
        at = next((i for i, token in enumerate(rest) if not token.startswith("-")), None)
        if at is None:
            return None, []
        command, rest = command.get_command(click.Context(command), rest[at]), rest[at + 1 :]
    return command, rest


def _paths_named(argv: list[str]) -> list[Path]:
    """Every existing file or folder an argument names, also inside CASE=PATH and A,B forms."""
    pieces = (piece for token in argv for piece in re.split("[=,]", token) if piece)
    return [resolved(Path(piece)) for piece in pieces if _exists(piece)]


def _exists(name: str) -> bool:
    try:
        return Path(name).exists()
    except (OSError, ValueError):  # a name too long, or with a NUL: not a path of this run
        return False


def _replaceable(path: Path, report: object, fmt: str, named: list[Path]) -> bool:
    """A new file, or a report of its kind that tconform wrote and that no other argument names
    and that lies in no folder an argument names (there it may be a file a command keeps, such
    as check's own check.json, which only the command itself can tell)."""
    if not os.path.lexists(path):
        return True  # ReportPath has refused one inside a golden or artifacts folder
    target = resolved(path)
    mentions = sum(other == target for other in named)
    inside_a_folder = any(other.is_dir() and target.is_relative_to(other) for other in named)
    return mentions == 1 and not inside_a_folder and is_own_report(report, fmt, path)
