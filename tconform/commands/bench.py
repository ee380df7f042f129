"""`tconform bench`: latency of ONNX Runtime on each provider and of PyTorch (eager and
torch.compile) on chosen cases and shapes, against the machine's measured GEMM ceiling.

Exit codes: 0 measured; 2 bad arguments (unknown engine, provider or case, a malformed shape or
one beyond the preset's maximum sequence, a --compare file that is not a bench report).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from tconform import registry
from tconform.bench import report as bench_report
from tconform.bench.compare import compare_lines, compare_reports, load_report
from tconform.bench.engines import ENGINES, parse_engines
from tconform.bench.runner import (
    DEFAULT_CASES,
    DEFAULT_SHAPES,
    BenchSettings,
    default_threads,
    parse_shape,
    run_bench,
)
from tconform.config import PRESETS, get_preset
from tconform.errors import UsageError
from tconform.runtimes.onnxruntime import GRAPH_OPT_LEVELS, parse_eps


@click.command("bench")
@click.option("--preset", default="base", show_default=True, help=f"One of {', '.join(PRESETS)}.")
@click.option(
    "--case",
    "cases",
    multiple=True,
    help=f"Case to time (repeatable) [{', '.join(DEFAULT_CASES)}].",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    help="BATCHxSEQ (repeatable); SEQ is both source and target length [1x32, 8x128].",
)
@click.option(
    "--engine",
    "engines",
    multiple=True,
    help=f"Restrict to these engines (repeatable): {', '.join(ENGINES)} [all].",
)
@click.option("--ep", default="all", show_default=True, help="ORT providers: cpu, cpu,cuda, all.")
@click.option("--threads", type=int, default=None, help="Intra-op threads, ORT and torch [cores].")
@click.option(
    "--graph-opt",
    type=click.Choice(list(GRAPH_OPT_LEVELS)),
    default="all",
    show_default=True,
    help="ONNX Runtime graph optimisation level.",
)
@click.option("--warmup", type=int, default=2, show_default=True, help="Untimed runs first.")
@click.option("--runs", type=int, default=None, help="Timed runs (overrides --seconds).")
@click.option(
    "--seconds", type=float, default=2.0, show_default=True, help="Time budget per measurement."
)
@click.option(
    "--artifacts",
    type=click.Path(path_type=Path),
    default=None,
    help="Export cache [artifacts/bench/<preset>].",
)
@click.option("--profile", is_flag=True, help="Add ONNX Runtime's per-op-type time per row.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the report.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), help="Write a PNG plot.")
@click.option("--markdown", "markdown_path", type=click.Path(path_type=Path), help="Write .md.")
@click.option(
    "--compare",
    nargs=2,
    type=click.Path(path_type=Path),
    default=None,
    help="Compare two bench JSON reports A B (ratios B/A) instead of measuring.",
)
def bench(
    preset,
    cases,
    shapes,
    engines,
    ep,
    threads,
    graph_opt,
    warmup,
    runs,
    seconds,
    artifacts,
    profile,
    json_path,
    plot_path,
    markdown_path,
    compare,
) -> None:
    """Time every engine on the chosen cases and shapes; report p50/p90/p99, tokens/s, GFLOP/s
    as a fraction of the measured GEMM ceiling, and peak memory."""
    if compare:
        for line in compare_lines(compare_reports(*(load_report(p) for p in compare))):
            click.echo(line)
        return
    settings = _settings(
        preset, cases, shapes, engines, ep, threads, graph_opt, warmup, runs, seconds, artifacts
    )
    if profile:
        settings = dataclasses.replace(settings, profile=True)
    log = lambda text: click.echo(text, err=True)  # noqa: E731 - progress goes to stderr
    header_shown = False

    def show(row: dict) -> None:
        nonlocal header_shown
        if not header_shown:
            click.echo(bench_report.table_header())
            header_shown = True
        click.echo(bench_report.table_line(row))
        for op, share in list(row.get("profile", {}).items())[:8]:
            click.echo(
                f"    {op:<28} {share['ms_per_run']:>9.3f} ms/run {100 * share['share']:5.1f}%"
            )

    result = run_bench(settings, log, show)
    for line in bench_report.ceiling_lines(result) + bench_report.ratio_lines(result):
        click.echo(line)
    if json_path:
        bench_report.write_json(json_path, result)
    if markdown_path:
        bench_report.write_markdown(markdown_path, result)
    if plot_path:
        bench_report.write_plot(plot_path, result)


def _settings(
    preset, cases, shapes, engines, ep, threads, graph_opt, warmup, runs, seconds, artifacts
) -> BenchSettings:
    """Validate every option before anything slow starts."""
    cfg = get_preset(preset)
    if threads is not None and threads < 1:
        raise UsageError(f"--threads {threads}: must be at least 1")
    if runs is not None and runs < 1:
        raise UsageError(f"--runs {runs}: must be at least 1")
    if warmup < 0 or seconds <= 0:
        raise UsageError("--warmup must be >= 0 and --seconds > 0")
    return BenchSettings(
        preset=preset,
        cfg=cfg,
        cases=registry.select_cases(cases or DEFAULT_CASES),
        shapes=tuple(parse_shape(s, cfg) for s in shapes) or DEFAULT_SHAPES,
        engines=parse_engines(engines),
        eps=tuple(parse_eps(ep)),
        threads=threads or default_threads(),
        graph_opt=graph_opt,
        warmup=warmup,
        runs=runs,
        seconds=seconds,
        artifacts=artifacts or Path("artifacts") / "bench" / preset,
    )
