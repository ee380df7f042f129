"""The `tconform` command line: parse, call a stage, print, exit with a documented code.

Exit codes (README, "Exit codes"): 0 all passed; 1 a conformance failure; 2 a usage, input or
environment error; 3 a requested execution provider could not run.
"""

from __future__ import annotations

import sys

import click

from tconform.commands.bench import bench
from tconform.commands.doc import doc
from tconform.commands.export import export
from tconform.commands.golden import golden
from tconform.commands.verify import verify
from tconform.errors import EXIT_USAGE, TconformError
from tconform.versions import tool_version


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(tool_version(), prog_name="tconform")
def cli() -> None:
    """Export a reference Transformer to ONNX, verify it on ONNX Runtime against exact
    goldens, and measure its latency."""


for command in (export, golden, verify, doc, bench):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    try:
        code = cli.main(args=argv, prog_name="tconform", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("tconform: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except TconformError as exc:
        click.echo(f"tconform: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:  # a file that cannot be read or written: name it, no traceback
        click.echo(f"tconform: error: {exc.filename or ''}: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_USAGE)
    sys.exit(code or 0)
