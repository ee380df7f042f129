"""The bench report as a terminal table, markdown (CI job summaries), JSON and a plot.

`BenchReport` is the report kind the run frame (tconform.commands.run) writes for `tconform
bench`, through the formats registry (tconform.report.formats): its JSON keeps the bench schema
(tconform-bench/5: settings, ceilings per precision, one row per timing, the best variants)
and, like every command's, gains `exit_code` and the `error` that ended the run early, with
the rows so far.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tconform.bench.summary import ratio as as_ratio
from tconform.bench.summary import shape_label
from tconform.bench.summary import summary_lines as best_lines
from tconform.errors import EXIT_FAILURE, UsageError
from tconform.files import atomic_write_json, atomic_write_text, read_json_object
from tconform.report.formats import Writer
from tconform.report.text import format_table
from tconform.results import Status
from tconform.runtimes.specs import base_name

TOOL = "tconform bench"
SCHEMA = "tconform-bench/5"  # (tconform.bench.runner writes it; kept here for reports without)


@dataclass
class BenchReport:
    """One bench run: `data` is the runner's report (filled as the run goes), `error` what ended
    it early."""

    command: str = "bench"
    data: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    error: dict | None = None
    writers: ClassVar[dict[str, str]] = {
        "json": "tconform.bench.report:JSON",
        "markdown": "tconform.bench.report:MARKDOWN",
        "plot": "tconform.bench.report:PLOT",
    }

    @property
    def exit_code(self) -> int:
        return int(self.error["exit_code"]) if self.error is not None else 0

    def blank(self) -> dict:
        """What the report holds before the run filled anything in."""
        return {
            "tool": TOOL,
            "schema": SCHEMA,
            "environment": self.environment,
            "settings": {},
            "ceiling": {},
            "ceilings": {},
            "unavailable": [],
            "results": [],
            "best": [],
        }

    def to_dict(self) -> dict:
        report = {**self.blank(), **self.data, "exit_code": self.exit_code, "error": self.error}
        return {**report, "versions": version_comparisons(report)}

    def render(self) -> str:
        """The table and, below it, the ceilings, ratios to torch and best variants."""
        report = self.to_dict()
        if not report["results"] and not report["unavailable"]:
            return ""
        return "\n".join([table(report), *summary_lines(report)])

    def summary(self) -> str:
        return ""


COLUMNS = (
    "case",
    "engine",
    "ep",
    "precision",
    "verdict",
    "shape",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "runs",
    "tokens_per_s",
    "gflops",
    "peak_fraction",
    "peak_mem_delta_mb",
)
_TEXT_COLUMNS = ("case", "engine", "ep")
HEADERS = {
    "precision": "computes in",
    "shape": "BxS",
    "tokens_per_s": "tok/s",
    "gflops": "GFLOP/s",
    "peak_fraction": "%ceiling",
    "peak_mem_delta_mb": "+RSS MB",
}


def _cell(row: dict, key: str) -> str:
    if key == "shape":
        return shape_label(row)
    if key == "verdict":  # its outputs judged under its precision's row; one not timed: why
        if row.get("status") != Status.PASS:
            return str(row.get("status"))
        return str((row.get("accuracy") or {}).get("status") or "-")
    if row.get("status") != Status.PASS and key not in _TEXT_COLUMNS:
        return "-"
    value = row.get(key)
    if value is None:
        return "-"
    if key == "peak_fraction":
        return f"{100 * value:.0f}%"
    if key == "tokens_per_s":
        return f"{value:.0f}"
    if isinstance(value, float):
        return f"{value:.4g}" if value < 1e5 else f"{value:.0f}"
    return str(value)


def _headers(report: dict) -> list[str]:
    """The columns' headers: a user's model's rows are named by input set, not BATCHxSEQ."""
    module = bool(report.get("settings", {}).get("module"))
    return ["input set" if k == "shape" and module else HEADERS.get(k, k) for k in COLUMNS]


def table(report: dict) -> str:
    """Every row, with the fractions of the final ceiling; skipped rows give their reason."""
    rows = [[_cell(row, key) for key in COLUMNS] for row in report["results"]]
    right = [i for i, key in enumerate(COLUMNS) if key not in _TEXT_COLUMNS]
    lines = [format_table(_headers(report), rows, right)]
    for row in report["results"]:
        if row.get("status") != Status.PASS:
            lines.append(
                f"  {row['case']} {row['engine']}/{row['ep']}: {row['status']}: {row.get('reason')}"
            )
        elif row.get("peak_fraction_note"):
            lines.append(
                f"  {row['case']} {shape_label(row)} {row['engine']}/{row['ep']}: "
                f"%ceiling: {row['peak_fraction_note']}"
            )
        for op, share in list(row.get("profile", {}).items())[:8]:
            lines.append(
                f"    {row['case']} {shape_label(row)} {row['engine']}/{row['ep']} "
                f"{op:<24} {share['ms_per_run']:>9.3f} ms/run {100 * share['share']:5.1f}%"
            )
    return "\n".join(lines)


def ceiling_lines(report: dict) -> list[str]:
    """Per provider, each precision's GEMM ceiling (its fastest probe; every probe and every
    probe that could not run), numpy's float32 GEMM and the copy bandwidth."""
    lines = []
    for ep, ceiling in report.get("ceilings", {}).items():
        for precision, entry in ceiling.get("precisions", {}).items():
            probes = entry.get("probes", {})
            measured = ", ".join(f"{name} {p['gflops']}" for name, p in probes.items())
            missing = "; ".join(f"{name}: {why}" for name, why in entry["unavailable"].items())
            text = f"ceiling {ep} {precision}: GEMM {entry['gflops'] or '-'} GFLOP/s"
            if measured:
                text += f" (best of {measured})"
            if missing:
                text += f"; not measured: {missing}"
            lines.append(text)
        extra = []
        if "numpy_gemm_gflops" in ceiling:
            extra.append(f"numpy float32 GEMM {ceiling['numpy_gemm_gflops']} GFLOP/s")
        if "copy_bandwidth_gbs" in ceiling:
            extra.append(f"copy bandwidth {ceiling['copy_bandwidth_gbs']} GB/s")
        if extra:
            lines.append(f"ceiling {ep}: " + "; ".join(extra))
    for missing in report.get("unavailable", []):
        lines.append(f"provider {missing['ep']}: unavailable, not timed ({missing['reason']})")
    return lines


def ratio_lines(report: dict) -> list[str]:
    """Each ONNX Runtime engine's p50 over torch eager's, per case and shape, on each device
    (on CUDA with and without IO binding: the bound run is the like-for-like one, since torch's
    inputs and outputs stay on the device)."""
    rows = [r for r in report["results"] if r.get("status") == Status.PASS]
    by_key = {(r["case"], shape_label(r), r["ep"], r["engine"]): r for r in rows}
    lines = []
    for (case, shape, ep, engine), row in by_key.items():
        torch_row = by_key.get((case, shape, ep, "torch"))
        if engine.startswith("onnxruntime") and torch_row:
            ratio = row["p50_ms"] / torch_row["p50_ms"]
            lines.append(f"{case} {shape} {ep}: {engine} p50 / torch p50 = {as_ratio(ratio)}")
    return lines


def version_comparisons(report: dict) -> list[dict]:
    """Versions of one engine in one run (onnxruntime==1.20.1 beside onnxruntime): per case,
    shape and provider, each one's p50 and its ratio to the first named."""
    rows = [r for r in report.get("results", []) if r.get("status") == Status.PASS]
    return compared_versions(rows, lambda r: (r["case"], shape_label(r), r["ep"]), "p50_ms")


def compared_versions(
    rows: list[dict], where: Callable[[dict], tuple[str, str, str]], metric: str
) -> list[dict]:
    """The rows' versions of one engine, grouped by `where` (case, shape, provider): each
    one's `metric` as its p50 and its ratio to the first named (what version_lines print)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((*where(r), base_name(r["engine"])), []).append(r)
    return [
        {
            "case": case,
            "shape": shape,
            "ep": ep,
            "engine": engine,
            "p50_ms": {r["engine"]: r[metric] for r in found},
            "to_first": {r["engine"]: round(r[metric] / found[0][metric], 4) for r in found},
        }
        for (case, shape, ep, engine), found in groups.items()
        if len(found) > 1
    ]


def version_lines(report: dict) -> list[str]:
    """The JSON's `versions`, a line per case, shape and provider."""
    return [
        f"{v['case']} {v['shape']} {v['ep']}: versions of {v['engine']}, p50: "
        + ", ".join(
            f"{engine} {p50} ms ({as_ratio(v['to_first'][engine])}x)"
            for engine, p50 in v["p50_ms"].items()
        )
        for v in report.get("versions", [])
    ]


def summary_lines(report: dict) -> list[str]:
    """What the terminal shows after the table: ceilings, ratios to torch, the versions of an
    engine, the best variants, and a busy machine's warning."""
    return (
        ceiling_lines(report)
        + ratio_lines(report)
        + version_lines(report)
        + best_lines(report.get("best", []))
        + load_lines(report.get("load") or {})
    )


BUSY_SHARE = 0.5  # of the cores: load from others above it makes timings another machine's


def load_lines(load: dict) -> list[str]:
    """A warning where other work ran beside the bench: a 1-minute load average above half
    the cores at its start, or above its own threads and half the cores at its end. Timings
    taken so are not a quiet machine's (torch slows more than ONNX Runtime under load)."""
    cores, start, end = load.get("cores"), load.get("at_start"), load.get("at_end")
    if not cores:
        return []
    own = load.get("threads") or cores
    busy = (start is not None and start > BUSY_SHARE * cores) or (
        end is not None and end > own + BUSY_SHARE * cores
    )
    if not busy:
        return []
    when = ", ".join(
        f"{value} at the {moment}"
        for value, moment in ((start, "start"), (end, "end"))
        if value is not None  # a run that ended early took no figure at its end
    )
    return [
        f"warning: the machine was busy (1-minute load average {when}, on {cores} cores, the "
        f"bench using {own}): these timings and their ratios are not a quiet machine's; time "
        "again when it is idle"
    ]


def _timed(settings: dict) -> str:
    """What the run timed: a user's model, or tconform's cases at a preset."""
    if settings.get("module"):
        return f"model `{settings['module']}`"
    return f"preset `{settings.get('preset')}`"


def ending(error: dict) -> str:
    """How a bench run with an `error` entry ended: exit 1 is a verdict on rows it measured (a
    row outside its tolerance, a crashed engine; the run went on), any other code stopped it."""
    if error["exit_code"] == EXIT_FAILURE:
        return f"The run failed (exit {EXIT_FAILURE})"
    return f"The run stopped early (exit {error['exit_code']})"


def markdown(report: dict) -> str:
    """A GitHub-flavoured table for CI job summaries."""
    import io

    keys = list(COLUMNS)
    out = io.StringIO()
    out.write("## tconform bench\n\n")
    error = report.get("error")
    if error:
        out.write(f"**{ending(error)}:** {error['message']}\n\n")
    settings = report.get("settings", {})
    out.write(
        f"{_timed(settings)}, threads {settings.get('intra_op_threads')}, "
        f"graph optimisation `{settings.get('graph_optimization')}`, "
        f"CPU {report.get('environment', {}).get('cpu')}\n\n"
    )
    for line in ceiling_lines(report):
        out.write(f"- {line}\n")
    out.write("\n| " + " | ".join(_headers(report)) + " |\n")
    out.write("|" + "---|" * len(keys) + "\n")
    for row in report["results"]:
        out.write("| " + " | ".join(_cell(row, k) for k in keys) + " |\n")
    lines = ratio_lines(report) + version_lines(report) + best_lines(report.get("best", []))
    if lines:
        out.write("\n" + "".join(f"- {line}\n" for line in lines))
    return out.getvalue()


def write_json(path: Path, report: BenchReport) -> None:
    from tconform.report.json_report import strict

    atomic_write_json(path, strict(report.to_dict()))


def is_own_json(path: Path) -> bool:
    """Whether `path` holds a bench JSON report (either kind: timings or --generate)."""
    try:
        data = read_json_object(path, what="bench report")
    except UsageError:
        return False
    return data.get("tool") == TOOL or data.get("kind") == "tconform-bench-generate"


def write_markdown(path: Path, report: BenchReport) -> None:
    atomic_write_text(path, markdown(report.to_dict()))


def is_own_markdown(path: Path, heading: str = "## tconform bench") -> bool:
    """Whether `path` holds a bench markdown summary (its first line is `heading`, tconform's)."""
    try:
        with path.open(encoding="utf-8") as text:
            return text.readline().rstrip("\n") == heading
    except (OSError, UnicodeDecodeError):
        return False


def write_plot(path: Path, report: BenchReport) -> None:
    """p50 bars with p90 whiskers per engine and shape (log scale) over the achieved fraction
    of the GEMM ceiling of the precision each computes in, one group of bars per case and
    shape."""
    from tconform.report import png

    data = report.to_dict()
    rows = [r for r in data["results"] if r.get("status") == Status.PASS]
    if not rows:  # nothing measured: the plot says why
        why = report.error["message"] if report.error else "no engine was timed"
        png.write_message(path, "tconform bench: nothing measured", str(why))
        return
    _plot_rows(path, data, rows)


def _plot_rows(path: Path, report: dict, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tconform.report import png

    groups = list(dict.fromkeys(f"{r['case']}\n{shape_label(r)}" for r in rows))
    engines = list(dict.fromkeys(f"{r['engine']}/{r['ep']}" for r in rows))
    width = 0.8 / max(1, len(engines))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, 1.3 * len(groups)), 8), sharex=True)
    for i, engine in enumerate(engines):
        xs, p50, whisker, fraction = [], [], [], []
        for g, group in enumerate(groups):
            for r in rows:
                in_group = f"{r['case']}\n{shape_label(r)}" == group
                if in_group and f"{r['engine']}/{r['ep']}" == engine:
                    xs.append(g + (i - (len(engines) - 1) / 2) * width)
                    p50.append(r["p50_ms"])
                    whisker.append(r["p90_ms"] - r["p50_ms"])
                    fraction.append(100 * (r.get("peak_fraction") or 0))
        top.bar(xs, p50, width, yerr=[[0] * len(whisker), whisker], capsize=3, label=engine)
        bottom.bar(xs, fraction, width, label=engine)
    top.set_yscale("log")
    top.set_ylabel("latency p50 (ms), whisker to p90")
    top.legend(fontsize=8)
    bottom.set_ylabel("% of its precision's GEMM ceiling")
    bottom.axhline(80, color="grey", linestyle="--", linewidth=0.8)
    bottom.set_xticks(range(len(groups)), groups, fontsize=8)
    ceiling = report.get("ceiling", {})
    fig.suptitle(  # two lines: the settings alone can be wider than the figure
        f"tconform bench, {_timed(report['settings']).replace('`', '')}\n"
        f"float32 ceiling {ceiling.get('gemm_gflops')} GFLOP/s ({ceiling.get('device')})",
        fontsize=10,
        wrap=True,
    )
    fig.tight_layout()
    png.save(fig, path, dpi=100)


def _is_own_plot(path: Path) -> bool:
    from tconform.report import png

    return png.is_own(path)


JSON = Writer(write_json, is_own_json)
MARKDOWN = Writer(write_markdown, is_own_markdown)
PLOT = Writer(write_plot, _is_own_plot)
