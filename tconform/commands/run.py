"""The frame every checking command shares: run, always write the requested reports (also when
the run stops early on an input error or a signal, with the results so far and an `error`
entry), print the table, and exit with the one rule of `tconform.results.exit_code`."""

from __future__ import annotations

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
