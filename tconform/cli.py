"""The `tconform` command line: parse, call a stage, print, exit with a documented code.

Exit codes (README, "Exit codes"): 0 all passed; 1 a conformance failure; 2 a usage, input or
environment error; 3 a requested execution provider could not run, or nothing was checked; 130
interrupted (Ctrl-C); 143 terminated (SIGTERM). Every error is one line on stderr, never a
traceback.
"""

from __future__ import annotations

import os
import signal
import sys

import click

from tconform import __version__
from tconform.commands import run as frame
from tconform.commands.bench import bench
from tconform.commands.check import check
from tconform.commands.doc import doc
from tconform.commands.export import export
from tconform.commands.golden import golden
from tconform.commands.report import report
from tconform.commands.run import write_error_reports
from tconform.commands.verify import verify
from tconform.errors import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    TconformError,
    Terminated,
    native_call_left,
    one_line,
)
from tconform.folders import require_caches_apart
from tconform.variables import VARIABLES, check_environment


@click.group(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Environment variables: "
    + "; ".join(
        f"{v.name}: {v.help.split(' (tconform.')[0]}" + (f" [{v.default}]" if v.default else "")
        for v in VARIABLES.values()
    )
    + ".",
)
@click.version_option(__version__, prog_name="tconform")
def cli() -> None:
    """Export a reference Transformer to ONNX, verify it on ONNX Runtime against exact
    goldens, and measure its latency; check your own PyTorch module the same way."""
    check_environment()  # before any command starts: a bad TCONFORM_* is one line, exit 2
    require_caches_apart()


for command in (export, golden, verify, report, doc, bench, check):
    cli.add_command(command)


class ForgivingStdout:
    """stdout that never stops a run. Once its reader has gone (`tconform verify | head`) it
    drops what follows silently: the run goes on, writes its reports and exits with its own code
    (left alone, click turns the broken pipe into exit 1, which reads as a conformance failure).
    Where it cannot be written (`>/dev/full`) it drops the rest too and keeps the error, which
    main() reports in one line naming stdout once the run, and its reports, are done."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._gone = False
        self.error: OSError | None = None

    def _stop_writing(self) -> None:
        self._gone = True
        # What Python still holds for the real stdout is flushed at exit: into /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def _attempt(self, action):
        try:
            return action()
        except BrokenPipeError:
            self._stop_writing()
        except OSError as exc:
            self.error = OSError(exc.errno, exc.strerror, "stdout")
            self._stop_writing()
        return None

    def write(self, text: str) -> int:
        if not self._gone:
            self._attempt(lambda: self._stream.write(text))
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            self._attempt(self._stream.flush)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> None:
    frame.received.clear()  # an earlier run in this process had its own signals
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, frame.on_signal)
    sys.unraisablehook = frame.quiet_unraisable  # a signal Python swallowed: no traceback
    # Started with stdout or stderr closed (`>&-`): what would go there goes nowhere.
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the process)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115
    if not isinstance(sys.stdout, ForgivingStdout):
        sys.stdout = ForgivingStdout(sys.stdout)
    sys.stdout.error = None  # an earlier run in this process had its own stdout
    args = sys.argv[1:] if argv is None else list(argv)
    frame.reports_written = False  # set by the run frame once it has written them

    # Once the exit code is decided, a later Ctrl-C or SIGTERM (a second one, or one while
    # Python shuts down) is ignored when this is the process's own entry: the first signal
    # decided the code and the reports, and the process is ending anyway.
    ending = frame.ignore_signals if argv is None else lambda: None

    def fail(message: str, code: int, line: str | None = None, error: BaseException | None = None):
        """One line and the exit code; the reports the command line asked for, where the run
        frame did not write them (an error before it started), none where `error` refused."""
        ending()
        if not frame.reports_written:
            write_error_reports(cli, args, message, code, error)
        click.echo(line or f"tconform: error: {one_line(message)}", err=True)
        if argv is None and native_call_left():  # its reports are written: leave it running
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        sys.exit(code)

    try:  # every relative path and default folder is read from it
        os.getcwd()
    except FileNotFoundError:
        fail("the current folder no longer exists (removed after the shell entered it)", EXIT_USAGE)
    try:
        code = cli.main(args=argv, prog_name="tconform", standalone_mode=False)
    except SystemExit as exc:  # a command that ended with its exit code (sys.exit, ctx.exit)
        code = exc.code
    except (click.exceptions.Abort, KeyboardInterrupt):
        fail("interrupted", EXIT_INTERRUPTED, "tconform: interrupted")
    except Terminated:
        fail("terminated", EXIT_TERMINATED, "tconform: terminated")
    except click.ClickException as exc:  # usage errors: one line naming the option, exit 2
        fail(exc.format_message(), exc.exit_code)
    except TconformError as exc:
        fail(str(exc), exc.exit_code, error=exc)
    except OSError as exc:  # a file that cannot be read or written: name it, no traceback
        fail(frame.describe_os_error(exc), EXIT_USAGE)
    except MemoryError:
        fail("out of memory (try a smaller shape or preset)", EXIT_USAGE)
    sys.stdout.flush()  # what is still buffered meets a full disk here, not unseen at exit
    lost = sys.stdout.error
    ending()
    if lost is not None:  # the run and its reports are done; what it printed is lost
        click.echo(f"tconform: error: {lost.filename}: {one_line(str(lost.strerror))}", err=True)
        sys.exit(code or EXIT_USAGE)
    sys.exit(code or 0)
