"""`tconform bench`: latency of ONNX Runtime on each provider and of PyTorch (eager and
torch.compile) on chosen cases and shapes, or on a user's model (PACKAGE.MODULE:FACTORY) at its
input sets, against the machine's measured GEMM ceiling, each row judged.

A user's model is timed in a child process (tconform.child), as `tconform check` runs it: its
code (the factory, forward, the export) never ends this process, and the report so far comes
back after every row.

Exit codes follow every command's rule: 0 measured, every row within its tolerance row; 1 a
timed row's outputs left their tolerance row (its times still reported), decoding
(`--generate`) met log-probabilities that are no distribution, or an engine's worker process
crashed; 2 bad
arguments (unknown engine, provider or case, a malformed shape, one beyond the preset's maximum
sequence or this machine's memory, a --compare file that is not a bench report; a target that is
no PACKAGE.MODULE:FACTORY, an option of tconform's own cases with one, an input set the model
lacks, the model's code failing or ending its process); 3 a requested provider cannot run (skip
with --allow-missing-ep; `--ep all`, the default, means every provider that runs here). The
requested reports are written on every exit, through the same frame as every checking command's
(tconform.commands.run), with an `error` entry where the run stopped.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import click

from tconform.commands.options import (
    FiniteRange,
    FolderPath,
    InputSetName,
    RegularFile,
    RuntimeCommand,
    ShapeType,
    WholeNumber,
    case_option,
    crash_folder_beside,
    module_options,
    preset_option,
    quiet_option,
    report_options,
    require_reports_outside,
    runtime_options,
    tolerance_options,
)
from tconform.commands.run import run_and_report, writes_report
from tconform.errors import EXIT_EP_UNAVAILABLE, EXIT_FAILURE, TconformError, UsageError

if TYPE_CHECKING:
    from tconform.generation.driver import Strategy


@dataclass(frozen=True)
class Generate:
    """`--generate N` and how it decodes: the command's one value for the decoding options."""

    tokens: int
    strategy: Strategy
    end_token: int | None


# --generate's options, each turned into a field of Generate (the strategy's by its own name)
_DECODING = ("generate_tokens", "strategy", "beam_width", "length_penalty", "top_k", "top_p",
             "sample_seed", "end_token")  # fmt: skip


def decoding_options(command):
    """The decoding group (--generate N, --strategy, --beam-width, --length-penalty, --top-k,
    --top-p, --sample-seed, --end-token), which the command receives as one `generate`
    parameter: a Generate, or None without --generate."""

    @functools.wraps(command)
    def with_decoding(*args, **kwargs):
        given = {name: kwargs.pop(name) for name in _DECODING}
        _refuse_passed_over(given["generate_tokens"] is not None, given["strategy"])
        generate = None
        if given["generate_tokens"] is not None:
            from tconform.generation.driver import Strategy  # torch: only when decoding

            strategy = Strategy(
                given["strategy"], given["beam_width"], given["length_penalty"],
                given["top_k"], given["top_p"], given["sample_seed"],
            )  # fmt: skip
            generate = Generate(given["generate_tokens"], strategy, given["end_token"])
        return command(*args, generate=generate, **kwargs)

    for option in reversed(_DECODING_OPTIONS):
        with_decoding = option(with_decoding)
    return with_decoding


# What --generate passes over (it decodes the generation model at batch 1), and the options
# each strategy takes: any other given is a usage error, never silently ignored.
_NOT_WITH_GENERATE = ("cases", "shapes")
_STRATEGY_TAKES = {
    "greedy": (),
    "beam": ("beam_width", "length_penalty"),
    "sample": ("top_k", "top_p", "sample_seed"),
}


def _refuse_passed_over(generating: bool, strategy: str) -> None:
    ctx = click.get_current_context()
    if generating:
        takes = {"generate_tokens", "strategy", "end_token", *_STRATEGY_TAKES[strategy]}
        passed_over = {*_NOT_WITH_GENERATE, *_DECODING} - takes
        why = f"not taken by --generate with --strategy {strategy}"
    else:
        passed_over = set(_DECODING[1:])
        why = "with --generate only"
    given = click.core.ParameterSource.COMMANDLINE
    ignored = [
        p
        for p in ctx.command.params
        if p.name in passed_over and ctx.get_parameter_source(p.name) == given
    ]
    if ignored:
        if ignored[0].name in _NOT_WITH_GENERATE:
            why = "not taken by --generate, which decodes the generation model at batch 1"
        raise click.UsageError(f"{ignored[0].opts[0]}: {why}")


_DECODING_OPTIONS = (
    click.option(
        "--generate",
        "generate_tokens",
        type=WholeNumber(1),
        default=None,
        metavar="N",
        help="Time autoregressive decoding of N new tokens instead (batch 1; docs/generation.md).",
    ),
    click.option(
        "--strategy",
        type=click.Choice(["greedy", "beam", "sample"]),
        default="greedy",
        show_default=True,
        help="With --generate.",
    ),
    click.option("--beam-width", type=WholeNumber(1), default=4, show_default=True),
    click.option("--length-penalty", type=FiniteRange(0), default=0.6, show_default=True),
    click.option("--top-k", type=WholeNumber(1), default=None, help="Sampling: keep k tokens."),
    click.option("--top-p", type=FiniteRange(0, 1, min_open=True), default=1.0, show_default=True),
    click.option("--sample-seed", type=WholeNumber(0), default=0, show_default=True),
    click.option(
        "--end-token",
        type=WholeNumber(0),
        default=None,
        help="End-token id [none: every run makes N tokens].",
    ),
)


@writes_report("bench", kind="tconform.bench.report:BenchReport")
@click.command("bench", cls=RuntimeCommand)
@click.argument("target", required=False, metavar="[PACKAGE.MODULE:FACTORY]")
@module_options("inputs", "dynamic", "model", "padding_mask")
@tolerance_options("with PACKAGE.MODULE:FACTORY; the row of each engine's precision")
@preset_option("base")
@case_option("Case to time (repeatable) [transformer and the heaviest components].")
@click.option(
    "--shape",
    "shapes",
    type=ShapeType(),
    multiple=True,
    help=(
        "BATCHxSEQ (repeatable); SEQ is both source and target length [1x32, 8x128, within "
        "the preset's length]."
    ),
)
@click.option(
    "--input-set",
    "input_sets",
    type=InputSetName(),
    multiple=True,
    help="With PACKAGE.MODULE:FACTORY, time the model at this input set (repeatable): example "
    "(the factory's inputs), batch-1, batch-N, seq-N (made from them where the batch or "
    "sequence axis is free, as tconform check makes them), or all [example].",
)
@click.option(
    "--engine",
    "engines",
    multiple=True,
    help="Restrict to these engines (repeatable): onnxruntime (the plain export), "
    "onnxruntime-sdpa (the --attention sdpa export: one fused ONNX Attention node per "
    "attention), torch, torch-compile [these four]; opt-in: onnxruntime-fused (the plain "
    "export through the onnxruntime.transformers optimizer), onnxruntime-fp16, "
    "onnxruntime-bf16, onnxruntime-int8 and onnxruntime-int4 (the --dtype float16, bfloat16, "
    "int8 and int4 exports), onnxruntime-sdpa-fp16 and onnxruntime-sdpa-int8 (the sdpa "
    "export in float16, in int8), openvino and "
    "openvino-bf16 (its bfloat16 inference precision; "
    "not available on a CPU without native bfloat16), torch-int8 (torch's dynamic int8 Linear "
    "layers), torch-bf16 (bfloat16 autocast), torch-compile-int8, torch-compile-bf16. Each "
    "row's share is of the GEMM ceiling of the precision it computes in; the report names the "
    "fastest verified graph variant per case and shape. With PACKAGE.MODULE:FACTORY: the "
    "model's dtype cells (onnxruntime: its float32 export; onnxruntime-fp16, onnxruntime-int8: "
    "its conversions; onnxruntime-bf16: its bfloat16 export), openvino, openvino-bf16 and the "
    "torch engines [onnxruntime, onnxruntime-fp16, onnxruntime-int8, torch, torch-compile, "
    "torch-int8]. With --generate: onnxruntime, onnxruntime-int8, onnxruntime-int4, openvino, "
    "openvino-bf16, torch, torch-int8, torch-bf16 [onnxruntime, torch]. ENGINE==VERSION or "
    "ENGINE@PYTHON times that release of the engine's runtime in a worker process (e.g. "
    "onnxruntime==1.20.1 beside onnxruntime compares two releases' speed; docs/versions.md).",
)
@runtime_options("ep", "allow_missing_ep", "threads", ep="all", threads="one per physical core")
@click.option(
    "--warmup", type=WholeNumber(0, 10000), default=2, show_default=True, help="Untimed runs."
)
@click.option(
    "--runs", type=WholeNumber(1, 10**6), default=None, help="Timed runs (overrides --seconds)."
)
@click.option(
    "--seconds",
    type=FiniteRange(0, 3600, min_open=True),
    default=2.0,
    show_default=True,
    help="Time budget per measurement.",
)
@click.option(
    "--artifacts",
    type=FolderPath(),
    default=None,
    help="Export cache [artifacts/bench/<preset>]; with PACKAGE.MODULE:FACTORY, the model's "
    "export folder, as check --out names it [artifacts/check/<target>].",
)
@click.option(
    "--profile",
    is_flag=True,
    help="Add ONNX Runtime's per-op-type time and the share outside matrix products per row.",
)
@report_options("json", "markdown", "plot")
@click.option(
    "--compare",
    nargs=2,
    type=RegularFile(),
    default=None,
    help="Compare two bench JSON reports A B (ratios B/A) instead of measuring.",
)
@decoding_options
@quiet_option()
def bench(
    target,
    module,
    tolerance,
    preset,
    cases,
    shapes,
    input_sets,
    engines,
    runtime,
    warmup,
    runs,
    seconds,
    artifacts,
    profile,
    reports,
    compare,
    generate,
    quiet,
) -> None:
    """Time every engine on the chosen cases and shapes, or on a user's model (PACKAGE.MODULE:
    FACTORY, as tconform check takes it) at its input sets; report p50/p90/p99, tokens/s,
    GFLOP/s as a fraction of the measured GEMM ceiling, and peak memory, each row's outputs
    judged against the float64 oracle (or the model's float64 copy)."""
    _require_one_kind(target, module, tolerance, compare or generate is not None)
    if compare:
        _compare(compare, reports)
        return
    if generate is not None:
        from tconform.bench.generate import GenerateReport, generate_run

        run = generate_run(
            preset, generate.tokens, generate.strategy, generate.end_token, engines, runtime,
            artifacts, crash_folder_beside(*reports.values()),
        )  # fmt: skip
        run_and_report(GenerateReport(), run, quiet, reports)
        return
    from tconform.bench.report import BenchReport

    if target is not None:  # its export folder, named after it unless --artifacts names one
        from tconform.check_folder import export_folder, require_target

        require_target(target)
        require_reports_outside(reports, [("--artifacts", export_folder(target, artifacts))])
    source = click.get_current_context().get_parameter_source("preset")
    if target is not None and source is click.core.ParameterSource.DEFAULT:
        preset = None  # a user's model has no preset; one given is refused as such
    options = (
        preset, cases, shapes, engines, runtime.ep_spec, runtime.threads, runtime.settings,
        warmup, runs, seconds, artifacts, profile,
        None if target is None else module.subject(target, None), input_sets,
        crash_folder_beside(*reports.values()), tolerance,
    )  # fmt: skip
    run_and_report(BenchReport(), partial(_timings, options, runtime, quiet), quiet, reports)


def _require_one_kind(target, module, tolerance, own_model_only: bool) -> None:
    """A user's model's options without its target, or tconform's own model's modes (--compare,
    --generate) with it, are one line each."""
    if target is not None and own_model_only:
        raise click.UsageError(
            "--compare and --generate are for tconform's own model, not PACKAGE.MODULE:FACTORY"
        )
    if tolerance.given and own_model_only:
        raise click.UsageError("--atol, --rtol and --tolerance judge a user's model's rows")
    if target is None and module.given():
        raise click.UsageError(
            f"{module.given()[0]} is for a user's model: give PACKAGE.MODULE:FACTORY"
        )


def _compare(paths, reports) -> None:
    from tconform.bench.compare import compare_reports, compare_table, load_report

    if any(reports.values()):
        raise click.UsageError("--compare prints its table only; drop --json/--markdown/--plot")
    click.echo(compare_table(compare_reports(*(load_report(p) for p in paths))))


def _timings(options: tuple, runtime, quiet: bool, report, progress) -> None:
    """The bench run of `options` (bench_settings' arguments) into `report`: tconform's cases
    in this process, a user's model in a child process (its code never ends this one)."""
    from tconform.bench.accuracy import require_within_tolerance
    from tconform.bench.run import bench_settings, run_bench
    from tconform.results import FAILING, nothing_checked

    settings = bench_settings(*options)
    if settings.module is not None:
        in_child(settings, report.data, progress)
    else:
        stderr = click.get_text_stream("stderr")
        bar = (
            (lambda length: _no_bar())
            if quiet
            else (lambda length: click.progressbar(length=length, label="timing", file=stderr))
        )
        run_bench(settings, progress, bar, into=report.data)
    # The table is printed once the ceiling is final, so stdout, JSON and markdown agree.
    unavailable = report.data["unavailable"]
    if unavailable and not runtime.allow_missing_ep:
        raise TconformError.with_code(
            f"provider {unavailable[0]['ep']} could not run "
            "(--allow-missing-ep reports it as skipped)",
            EXIT_EP_UNAVAILABLE,
        )
    failed = [row for row in report.data["results"] if row["status"] in FAILING]
    if failed:  # the run went on past it; its rows and reports are all there
        raise TconformError.with_code(
            f"{len(failed)} engine run(s) crashed or could not open their model: "
            f"{failed[0]['reason']}",
            EXIT_FAILURE,
        )
    if nothing_checked(row["status"] for row in report.data["results"]):
        raise TconformError.with_code(
            "nothing was timed: every engine was skipped (see the table)", EXIT_EP_UNAVAILABLE
        )
    require_within_tolerance(report.data["results"])


def in_child(settings, into: dict, progress) -> None:
    """The bench of a user's model in a spawned child (tconform.child), as tconform check runs
    it: whatever the model's code does (sys.exit, os._exit, a crash) ends that process, never
    this one; the report so far comes back after every row, so an early end keeps it. A
    process that dies while an engine is timed (a runtime's native code crashing in it) is that
    engine's `crash` row, exit 1, as check makes it a lane's; the rows after it are not timed."""
    from tconform.child import run_in_child
    from tconform.results import Status

    target = settings.module.target
    phase = ["starting"]
    timing: list[dict] = []  # the row being timed, as far as it is known before it runs

    def on_message(message) -> None:
        kind, payload = message
        if kind == "progress":
            phase[0] = str(payload).strip().removeprefix(f"{target}: ")
            progress(payload)
        elif kind == "report":  # sent as each row ends
            into.clear()
            into.update(payload)
            timing.clear()
        elif kind == "start":  # a timing begins: no line, but the phase a crash names
            row, phase[0] = payload
            timing[:] = [row]

    def ended_early(how: str) -> str:
        ended = f"{target}: the bench's process {how} while {phase[0]}"
        if timing:
            return f"{ended}; the rows after it were not timed{_isolated(timing[0]['engine'])}"
        return f"{ended}, before it finished"

    try:
        into.update(run_in_child(bench_in_child, (settings,), on_message, target, ended_early))
    except UsageError as exc:
        if not timing:
            raise
        crash = {**timing[0], "status": Status.CRASH.value, "reason": str(exc)}
        into.setdefault("results", []).append(crash)
        raise TconformError.with_code(str(exc), EXIT_FAILURE) from None


def _isolated(engine: str) -> str:
    """The way on where `engine`'s runtime, in this process, took the bench down with it: the
    same engine in a worker process of its own, whose crash is a row (docs/versions.md)."""
    from tconform.bench.engines import engine_runtime
    from tconform.runtimes import can_isolate

    if not can_isolate(engine_runtime(engine)):
        return ""
    return (
        f"; give it as --engine {engine}@python to run it in a worker process of its own, "
        "where a crash is that engine's row"
    )


def bench_in_child(send, settings) -> dict:
    """In the bench's process: the factory, the exports and every timing (tconform.bench.run);
    each change of the report is sent as it happens."""
    from tconform.bench.run import run_bench

    return run_bench(  # the child's progress is its log lines, sent to the command's stderr
        settings,
        lambda line: send(("progress", line)),
        lambda length: _no_bar(),
        on_change=lambda report: send(("report", report)),
        on_start=lambda row, what: send(("start", (row, what))),
    )


def _no_bar():
    """A progress bar that shows nothing (-q, or a child whose progress is its lines)."""
    import contextlib

    class NoBar:
        def update(self, _: int) -> None:
            pass

    return contextlib.nullcontext(NoBar())
