"""The frame every checking command shares: run, always write the requested reports (also when
the run stops early on an input error or a signal, with the results so far and an `error`
entry), print the table, and exit with the one rule of `tconform.results.exit_code`."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from pathlib import Path

import click

from tconform.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, TconformError, Terminated


def progress_printer(quiet: bool) -> Callable[[str], None]:
    return (lambda _: None) if quiet else (lambda line: click.echo(line, err=True))


def run_and_report(
    command: str,
    run: Callable,
    quiet: bool,
    json_path: Path | None = None,
    junit_path: Path | None = None,
    markdown_path: Path | None = None,
    plot_path: Path | None = None,
    render: Callable | None = None,
) -> None:
    """`run(report, progress)` fills a RunReport; this writes it out and exits."""
    from tconform.report import RunReport, table, write_reports
    from tconform.report.environment import environment, utc_now

    report = RunReport(command)
    started = utc_now()
    interrupted: BaseException | None = None
    try:
        run(report, progress_printer(quiet))
    except TconformError as exc:
        report.error = {"message": str(exc), "exit_code": exc.exit_code}
    except (KeyboardInterrupt, click.exceptions.Abort, Terminated) as exc:
        code = EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
        report.error = {"message": "interrupted", "exit_code": code}
        interrupted = exc
    report.environment = environment(started)
    text = (render or table.render)(report.results) if report.results else ""
    if text:
        click.echo(text)
    write_reports(report, json_path, junit_path, markdown_path, plot_path)
    if interrupted is not None:
        raise interrupted  # the CLI's one line and exit code for a signal
    if report.error is not None:
        raise TconformError.with_code(str(report.error["message"]), report.exit_code)
    click.echo(table.summary(report.results))
    raise SystemExit(report.exit_code)


def writes_run_report(name: str):
    """Mark a command whose reports are run reports of `name`, so that a bad option, which
    stops click before the command starts, still gets them written (write_error_reports)."""

    def mark(command: click.Command) -> click.Command:
        command.run_report = name  # type: ignore[attr-defined]
        return command

    return mark


def write_error_reports(group: click.Group, argv: list[str], message: str, code: int) -> None:
    """The run reports `argv` asked for, holding only the error entry of a usage error that
    click raised before the command ran (`--exporter nosuch`, a missing argument). A report is
    written only where it passed its option's own checks and replaces nothing but a report of
    its kind that tconform wrote, and never a file or folder that `argv` names otherwise."""
    from tconform.report import RunReport, json_report, junit, markdown, write_reports
    from tconform.report.environment import environment, utc_now

    command, rest = _leaf_command(group, argv)
    name = getattr(command, "run_report", None)
    if command is None or name is None:
        return
    ctx = command.make_context(name, rest, resilient_parsing=True)  # bad values become None
    kinds = {"json_path": json_report, "junit_path": junit, "markdown_path": markdown}
    named = _paths_named(argv)
    asked = {dest: ctx.params[dest] for dest in kinds if ctx.params.get(dest)}
    targets = [path.resolve() for path in asked.values()]
    paths = {
        dest: path
        for dest, path in asked.items()
        if targets.count(path.resolve()) == 1  # two reports named one file: neither
        and _replaceable(path, kinds[dest].is_own, named)
    }
    if paths:
        report = RunReport(name, error={"message": message, "exit_code": code})
        report.environment = environment(utc_now())
        # The usage error stays the one line shown, even if a report cannot be written.
        with contextlib.suppress(TconformError, OSError):
            write_reports(report, **paths)


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
    return [Path(piece).resolve() for piece in pieces if _exists(piece)]


def _exists(name: str) -> bool:
    try:
        return Path(name).exists()
    except (OSError, ValueError):  # a name too long, or with a NUL: not a path of this run
        return False


def _replaceable(path: Path, is_own: Callable[[Path], bool], named: list[Path]) -> bool:
    target = path.resolve()
    mentions = sum(other == target for other in named)
    inside_a_folder = any(other.is_dir() and target.is_relative_to(other) for other in named)
    if not path.exists():
        return mentions == 0 and not inside_a_folder
    return mentions == 1 and not inside_a_folder and is_own(path)
