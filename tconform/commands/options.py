"""Options and click types shared by the commands, defined once.

Bad values are click usage errors (exit 2, click's one-line message naming the option), found
when the command line is parsed, before anything slow starts: report paths are checked for
writability up front, so a run is never lost to a typo in `--json`.
Importing this module stays cheap (no torch, onnx or onnxruntime): `tconform --help` is fast.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import click

from tconform.config import ATTENTION_KERNELS, DEFAULT_PRESET, DEFAULT_SEED, MAX_SEED, PRESETS

SHAPE = re.compile(r"\s*(\d{1,9})\s*[xX]\s*(\d{1,9})\s*")
MAX_BATCH = 65536  # far beyond anything a bench or a check runs; memory is checked separately


class ShapeType(click.ParamType):
    """'8x128' -> (8, 128): batch x sequence, each at least 1."""

    name = "BATCHxSEQ"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        found = SHAPE.fullmatch(str(value))
        if not found:
            self.fail(f"{value!r} is not BATCHxSEQ (e.g. 8x128)", param, ctx)
        batch, seq = int(found.group(1)), int(found.group(2))
        if not 1 <= batch <= MAX_BATCH or seq < 1:
            self.fail(
                f"{value!r}: batch must be 1..{MAX_BATCH} and sequence at least 1", param, ctx
            )
        return batch, seq


class RuntimeName(click.ParamType):
    """A key of tconform.runtimes.RUNTIMES, read when the option is parsed, so that a runtime
    added to the registry is a choice with no edit here."""

    name = "runtime"

    def get_metavar(self, param, ctx=None) -> str:
        from tconform.runtimes import RUNTIMES

        return "[" + "|".join(RUNTIMES) + "]"

    def convert(self, value, param, ctx) -> str:
        from tconform.runtimes import RUNTIMES

        if value not in RUNTIMES:
            self.fail(f"{value!r} is not one of {', '.join(RUNTIMES)}", param, ctx)
        return value


class ShardType(click.ParamType):
    """'2/3' -> (2, 3): shard K of N, 1 <= K <= N."""

    name = "K/N"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        index, sep, count = str(value).partition("/")
        if not (sep and index.strip().isdigit() and count.strip().isdigit()):
            self.fail(f"{value!r} is not K/N (e.g. 2/3)", param, ctx)
        index, count = int(index), int(count)
        if not 1 <= index <= count:
            self.fail(f"{value!r}: K must be 1..N (shards are numbered from 1)", param, ctx)
        return index, count


class CommaList(click.ParamType):
    """'a,b' -> ('a', 'b'), each value one of `choices()` (a callable, so that a list held by a
    heavy module is read only when the option is given); `convert` turns each into its type."""

    name = "LIST"

    def __init__(self, choices, convert=str) -> None:
        self.choices = choices
        self.to_value = convert

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        items = [item.strip() for item in str(value).split(",") if item.strip()]
        allowed = [str(c) for c in self.choices()]
        for item in items:
            if item not in allowed:
                self.fail(f"unknown value {item!r}; choose from {', '.join(allowed)}", param, ctx)
        if not items:
            self.fail("give at least one value", param, ctx)
        return tuple(dict.fromkeys(self.to_value(item) for item in items))


# Files a report must never replace: models and tensors (a given model under test among them).
NOT_A_REPORT = (".onnx", ".pb", ".data")


class ReportPath(click.ParamType):
    """A file a report will be written to, checked before the run: its folder exists and is
    writable, it is not a folder itself, it has the suffix its format needs, it is not a model
    or tensor file, and it does not lie inside a golden or artifacts folder."""

    name = "FILE"

    def __init__(self, suffix: str | None = None) -> None:
        self.suffix = suffix

    def convert(self, value, param, ctx):
        path = Path(value)
        if self.suffix and path.suffix.lower() != self.suffix:
            self.fail(f"{path}: the file must end in {self.suffix}", param, ctx)
        if path.is_dir():
            self.fail(f"{path}: is a folder", param, ctx)
        if path.suffix.lower() in NOT_A_REPORT:
            self.fail(f"{path}: a model or tensor file name, not a report's", param, ctx)
        from tconform.folders import managed_folder

        inside = managed_folder(path)
        if inside is not None:
            self.fail(
                f"{path}: inside {inside}, a tconform golden or artifacts folder; reports go "
                "elsewhere",
                param,
                ctx,
            )
        if path.exists() and not path.is_file():
            self.fail(f"{path}: exists and is not a regular file", param, ctx)
        folder = path.parent
        if not folder.is_dir():
            self.fail(f"{path}: folder {folder} does not exist", param, ctx)
        if not os.access(folder, os.W_OK | os.X_OK) or (
            path.exists() and not os.access(path, os.W_OK)
        ):
            self.fail(f"{path}: not writable", param, ctx)
        return path


def require_reports_apart(inputs, *reports, what: str = "an input of this run") -> None:
    """No report may be written over a file the run reads or keeps (a model under test, a
    shard report being merged, tconform check's own files), whatever that file is called."""
    kept = {Path(path).resolve() for path in inputs}
    for report in reports:
        if report is not None and Path(report).resolve() in kept:
            raise click.UsageError(f"{report}: {what}; reports go elsewhere")


def preset_option(default: str = DEFAULT_PRESET):
    return click.option(
        "--preset",
        type=click.Choice(list(PRESETS)),
        default=default,
        show_default=True,
        help="Model dimensions and variant options.",
    )


def attention_option(help: str):
    """--attention plain|sdpa: how the exported graphs compute attention."""
    return click.option(
        "--attention",
        type=click.Choice(ATTENTION_KERNELS),
        default=None,
        help="Attention kernel of the exported graphs: plain (MatMul, Softmax, ... written out) "
        "or sdpa (torch's scaled_dot_product_attention, one ONNX Attention node at opset 23 that "
        "ONNX Runtime runs fused; same function, docs/performance.md). " + help,
    )


def case_option(help: str = "Only this case (repeatable)."):
    return click.option("--case", "cases", multiple=True, metavar="CASE", help=help)


def seed_option():
    return click.option(
        "--seed",
        type=click.IntRange(0, MAX_SEED),
        default=DEFAULT_SEED,
        show_default=True,
        help="Seed of the weights and inputs.",
    )


def ep_option(default: str = "cpu"):
    return click.option(
        "--ep",
        "ep_spec",
        default=default,
        show_default=True,
        help="Execution providers: cpu, cuda, a comma list, or all (every one that runs here).",
    )


def allow_missing_ep_option():
    return click.option(
        "--allow-missing-ep",
        is_flag=True,
        help="Report a requested provider that cannot run as skip (with the reason) instead of "
        "exiting 3.",
    )


def folder_option(flag: str, dest: str, default: Path, help: str):
    """An option naming a folder (never a file), with its default shown."""
    return click.option(
        flag,
        dest,
        type=click.Path(path_type=Path, file_okay=False),
        default=default,
        show_default=True,
        help=help,
    )


def artifacts_option(help: str):
    return folder_option("--artifacts", "artifacts_dir", Path("artifacts"), help)


def report_options(*formats: str):
    """--json/--junit/--markdown/--plot, each a ReportPath checked before the run."""
    helps = {
        "json": ("--json", "json_path", None, "Write the JSON report."),
        "junit": ("--junit", "junit_path", None, "Write JUnit XML (for CI systems)."),
        "markdown": ("--markdown", "markdown_path", None, "Write a markdown summary."),
        "plot": ("--plot", "plot_path", ".png", "Write a PNG plot."),
    }

    dests = [helps[fmt][1] for fmt in formats]

    def decorate(command):
        @functools.wraps(command)
        def with_distinct_reports(*args, **kwargs):
            paths = [kwargs[dest].resolve() for dest in dests if kwargs.get(dest)]
            if len(set(paths)) < len(paths):
                raise click.UsageError("two report options name the same file; give each its own")
            return command(*args, **kwargs)

        for fmt in reversed(formats):
            flag, dest, suffix, text = helps[fmt]
            with_distinct_reports = click.option(flag, dest, type=ReportPath(suffix), help=text)(
                with_distinct_reports
            )
        return with_distinct_reports

    return decorate


def quiet_option():
    return click.option("-q", "--quiet", is_flag=True, help="No progress lines.")


def generation_golden_option():
    return folder_option(
        "--golden-generation",
        "golden_generation_dir",
        Path("golden-generation"),
        "Generation goldens (with --generation).",
    )


def shard_option():
    return click.option(
        "--shard",
        type=ShardType(),
        help="Check only shard K of N of the run's work units (CI machines: every unit lands "
        "in exactly one shard; merge the reports with `tconform report merge`).",
    )
