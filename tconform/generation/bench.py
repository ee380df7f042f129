"""`tconform bench --generate N`: how fast the exported model decodes, per engine and provider.

For batch 1 and a source of 32 tokens (the preset's maximum if shorter), each engine decodes
N new tokens with the chosen strategy (default greedy, no end token, so every run makes N
tokens) twice: with the key/value cache and with the whole prefix each step. Every step call
is timed. The report gives the encoder latency, per-token p50/p90 with and without the cache,
tokens/s, the cache's bytes after N tokens, the per-token time at each prefix length
(plotted), and the memory floor per token: the weight bytes one decoder step reads (all
decoder and head weights, one embedding row) over the measured copy bandwidth
(tconform.bench.ceiling), the floor `tconform bench` reports for batch-1 cases.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from tconform.bench.ceiling import copy_bandwidth_gbs, cpu_name
from tconform.bench.timing import round_sig, timed_runs
from tconform.config import ModelConfig
from tconform.errors import WorkerCrashed
from tconform.execution import NotRun, Subject, case_module, open_subject
from tconform.export import ExportSettings, export_cases
from tconform.files import atomic_write_bytes, atomic_write_json
from tconform.generation.driver import Decoding, Strategy, check_request, generate
from tconform.generation.steppers import CachedStepper, make_stepper
from tconform.models import ModelUnderTest
from tconform.reference import Transformer
from tconform.registry import ENCODER, GENERATION_CASES, STEP, Shape
from tconform.report.formats import Writer
from tconform.results import Status
from tconform.runtimes import label, make_runtime
from tconform.runtimes.specs import base_name
from tconform.weights import DEFAULT_SEED, make_params


@dataclass
class TimedStepper:
    """A stepper that records how long each step took and how long the prefix was."""

    inner: object
    times: list[tuple[int, float]] = field(default_factory=list)  # (prefix length, seconds)

    def start(self, src_ids, src_keep) -> None:
        self.inner.start(src_ids, src_keep)
        self.times = []

    def step(self, tokens, keep):
        started = time.perf_counter()
        log_probs = self.inner.step(tokens, keep)
        self.times.append((len(self.times) + 1, time.perf_counter() - started))
        return log_probs

    def reorder(self, rows) -> None:
        self.inner.reorder(rows)


def decoder_step_weight_bytes(cfg: ModelConfig) -> int:
    """Weight bytes one decoder step reads: the step model's parameters, of the target
    embedding only the one row a new token gathers."""
    return STEP.weight_bytes_read(cfg, Shape(1, 1, 1))


@dataclass(frozen=True)
class GenerateSettings:
    cfg: ModelConfig
    preset: str
    new_tokens: int
    strategy: Strategy
    decoding: Decoding
    engines: tuple[tuple[str, str], ...]  # (runtime name, ep)
    threads: int
    batch: int = 1
    src_len: int = 32
    repeats: int = 3
    artifacts: Path = Path("artifacts/bench/base/generation")
    crash_folder: Path | None = None  # where an engine in a worker that crashes leaves a bundle


def _decode_times(stepper, inputs, settings: GenerateSettings) -> list[list[float]]:
    """Per step, the seconds of each repeat (after one untimed warm-up decode)."""
    runs = []
    for _ in range(settings.repeats + 1):
        generate(stepper, *inputs, settings.decoding, settings.strategy)
        runs.append([seconds for _, seconds in stepper.times])
    return [list(step) for step in zip(*runs[1:], strict=True)]


def _decode_row(runtime, sessions, cfg, settings, feeds, floor_ms: float, ep: str) -> dict:
    """One engine's row: the encoder's latency and each step's, with and without the cache."""
    src_ids, src_keep = feeds["src_ids"], feeds["src_keep"]
    encoder = timed_runs(lambda: sessions[ENCODER.name].run(feeds), warmup=1, runs=5)
    per_step = {}
    for cache in (True, False):
        stepper = TimedStepper(make_stepper(sessions, cfg, cache))
        per_step[cache] = _decode_times(stepper, (src_ids, src_keep), settings)
        if isinstance(stepper.inner, CachedStepper):
            cached = stepper.inner
    row = {"engine": label(runtime), "settings": runtime.settings()}
    row["cache_bytes"] = cached.cache_bytes()
    row["cache_on"] = cached.cache_location()
    row["encoder_ms"] = round_sig(float(np.median(encoder)) * 1e3)
    for cache, name in ((True, "cached"), (False, "no_cache")):
        ms = np.array(per_step[cache]) * 1e3  # (steps, repeats)
        row[f"{name}_p50_ms"] = round_sig(float(np.percentile(ms, 50)))
        row[f"{name}_p90_ms"] = round_sig(float(np.percentile(ms, 90)))
        row[f"{name}_by_prefix_ms"] = [round_sig(float(v)) for v in np.median(ms, axis=1)]
    row["tokens_per_s"] = round_sig(settings.batch * 1e3 / row["cached_p50_ms"])
    last = settings.new_tokens - 1
    row["speedup_at_last_token"] = round_sig(
        row["no_cache_by_prefix_ms"][last] / row["cached_by_prefix_ms"][last]
    )
    if ep == "cpu":
        row["floor_ratio"] = round_sig(row["cached_p50_ms"] / floor_ms)
    return row


KIND = "tconform-bench-generate"


def run_generate_bench(settings: GenerateSettings, log, into: dict | None = None) -> dict:
    """The report (`into`, filled as the run goes, when given): one row per engine."""
    report = {} if into is None else into
    cfg = settings.cfg
    check_request(cfg, settings.decoding, settings.strategy)
    log(f"generation models in {settings.artifacts}: exported where not current ...")
    records = export_cases(GENERATION_CASES, ExportSettings(cfg, DEFAULT_SEED), settings.artifacts)
    models = {
        case.name: ModelUnderTest(case, Path(record.location), record.provenance())
        for case, record in zip(GENERATION_CASES, records, strict=True)
    }
    params = make_params(Transformer(cfg), DEFAULT_SEED)
    rng = np.random.default_rng(0)
    src_len = min(settings.src_len, cfg.max_seq_len)
    src_ids = rng.integers(3, cfg.src_vocab, (settings.batch, src_len), dtype=np.int64)
    src_keep = np.ones_like(src_ids, dtype=bool)
    feeds = {"src_ids": src_ids, "src_keep": src_keep}
    weight_bytes = decoder_step_weight_bytes(cfg)
    bandwidth = copy_bandwidth_gbs()
    floor_ms = weight_bytes / (bandwidth * 1e9) * 1e3
    rows, unavailable = [], []
    report.update(
        {
            "kind": KIND,
            "preset": settings.preset,
            "config": cfg.to_dict(),
            "batch": settings.batch,
            "new_tokens": settings.new_tokens,
            "strategy": vars(settings.strategy),
            "threads": settings.threads,
            "src_len": src_len,
            "repeats": settings.repeats,
            "cpu": cpu_name(),
            "step_weight_bytes": weight_bytes,
            "copy_bandwidth_gbs": round_sig(bandwidth),
            "memory_floor_ms": round_sig(floor_ms),
            "rows": rows,
            "unavailable": unavailable,
        }
    )
    crashed = report.setdefault("crashed", [])
    for runtime_name, ep in settings.engines:
        runtime = make_runtime(
            runtime_name, ep, threads=settings.threads, crash_folder=settings.crash_folder
        )
        log(f"{label(runtime)}: decoding {settings.new_tokens} tokens with and without the cache")
        with ExitStack() as stack:
            try:
                sessions = {
                    case.name: stack.enter_context(
                        open_subject(
                            runtime, Subject(models[case.name], case_module(case, cfg, params))
                        )
                    )
                    for case in GENERATION_CASES
                }
                rows.append(_decode_row(runtime, sessions, cfg, settings, feeds, floor_ms, ep))
            except NotRun as why:
                where = crashed if why.status == Status.CRASH else unavailable
                where.append({"engine": runtime_name, "ep": ep, "reason": str(why)})
            except WorkerCrashed as exc:  # its worker died decoding: a verdict, the run goes on
                crashed.append({"engine": runtime_name, "ep": ep, "reason": str(exc)})
    return report


def table(report: dict) -> str:
    from tconform.report.text import format_table

    header = ["engine", "encoder ms", "cached p50/p90 ms", "no-cache p50/p90 ms", "tokens/s",
              f"x faster @{report['new_tokens']}", "x floor", "cache MiB", "cache on"]  # fmt: skip
    body = [
        [
            r["engine"],
            str(r["encoder_ms"]),
            f"{r['cached_p50_ms']}/{r['cached_p90_ms']}",
            f"{r['no_cache_p50_ms']}/{r['no_cache_p90_ms']}",
            str(r["tokens_per_s"]),
            str(r["speedup_at_last_token"]),
            str(r.get("floor_ratio", "-")),
            f"{r['cache_bytes'] / 2**20:.2f}",
            r["cache_on"],
        ]
        for r in report["rows"]
    ]
    floor = (
        f"memory floor per token {report['memory_floor_ms']} ms = "
        f"{report['step_weight_bytes'] / 1e6:.1f} MB of decoder-step weights / "
        f"{report['copy_bandwidth_gbs']} GB/s copy bandwidth ({report['cpu']})"
    )
    return format_table(header, body) + "\n" + floor


def markdown(report: dict) -> str:
    """The table for CI job summaries (in a code block: it is the terminal's)."""
    lines = ["## tconform bench --generate", ""]
    error = report.get("error")
    if error:
        lines += [f"**The run stopped early (exit {error['exit_code']}):** {error['message']}", ""]
    if report.get("rows"):
        lines += ["```", table(report), "```"]
    return "\n".join(lines) + "\n"


def write_plot(path: Path, report: GenerateReport) -> None:
    """Per-token milliseconds at each prefix length, with and without the cache, per engine."""
    from tconform.report import png

    data = report.to_dict()
    if not data["rows"]:  # nothing measured: the plot says why
        why = report.error["message"] if report.error else "no engine decoded"
        png.write_message(path, "tconform bench --generate: nothing measured", str(why))
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for row in data["rows"]:
        steps = range(1, len(row["cached_by_prefix_ms"]) + 1)
        ax.plot(steps, row["cached_by_prefix_ms"], label=f"{row['engine']} with cache")
        ax.plot(steps, row["no_cache_by_prefix_ms"], "--", label=f"{row['engine']} no cache")
    ax.axhline(data["memory_floor_ms"], color="grey", linewidth=1, label="memory floor (CPU)")
    ax.set_xlabel("prefix length (tokens fed so far)")
    ax.set_ylabel("ms per token (median of repeats)")
    ax.set_title(f"tconform bench --generate {data['new_tokens']}: {data['preset']} preset")
    ax.legend(fontsize="small")
    fig.tight_layout()
    png.save(fig, path, dpi=110)


def write_json(path: Path, report: GenerateReport) -> None:
    from tconform.report.json_report import strict

    atomic_write_json(path, strict(report.to_dict()))


def write_markdown(path: Path, report: GenerateReport) -> None:
    atomic_write_bytes(path, markdown(report.to_dict()).encode())


def _is_own_markdown(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as text:
            return text.readline().rstrip("\n") == "## tconform bench --generate"
    except (OSError, UnicodeDecodeError):
        return False


def _is_own_json(path: Path) -> bool:
    from tconform.bench.report import is_own_json

    return is_own_json(path)


def _is_own_plot(path: Path) -> bool:
    from tconform.report import png

    return png.is_own(path)


JSON = Writer(write_json, _is_own_json)
MARKDOWN = Writer(write_markdown, _is_own_markdown)
PLOT = Writer(write_plot, _is_own_plot)


@dataclass
class GenerateReport:
    """`bench --generate`'s report kind for the run frame: `data` is run_generate_bench's report
    (filled as the run goes), `error` what ended it early."""

    command: str = "bench"
    data: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    error: dict | None = None
    writers: ClassVar[dict[str, str]] = {
        "json": "tconform.generation.bench:JSON",
        "markdown": "tconform.generation.bench:MARKDOWN",
        "plot": "tconform.generation.bench:PLOT",
    }

    @property
    def exit_code(self) -> int:
        return int(self.error["exit_code"]) if self.error is not None else 0

    def to_dict(self) -> dict:
        report = {
            "tool": "tconform bench",
            "kind": KIND,
            "environment": self.environment,
            "rows": [],
            "unavailable": [],
            **self.data,
        }
        report["exit_code"] = self.exit_code
        report["error"] = self.error
        return report

    def render(self) -> str:
        report = self.to_dict()
        return table(report) if report["rows"] else ""

    def summary(self) -> str:
        return ""


GENERATE_ENGINES = ("onnxruntime", "torch")


def generate_run(
    preset: str,
    new_tokens: int,
    strategy: Strategy,
    end_token: int | None,
    engines: tuple[str, ...],
    runtime,
    artifacts: Path | None,
    crash_folder: Path | None = None,
):
    """The run (for tconform.commands.run.run_and_report) of `bench --generate`: validate the
    request (UsageError: one line, exit 2), measure into the report, and exit 3 where a
    requested provider could not run. `runtime` is the command's RuntimeChoice."""

    def run(report: GenerateReport, progress) -> None:
        from tconform.bench.run import default_threads
        from tconform.config import get_preset
        from tconform.errors import EXIT_EP_UNAVAILABLE, EXIT_FAILURE, TconformError, UsageError
        from tconform.runtimes.providers import parse_eps

        cfg = get_preset(preset)
        unknown = [e for e in engines if base_name(e) not in GENERATE_ENGINES]
        if unknown:
            raise UsageError(
                f"engine {unknown[0]!r} does not decode; choose from {', '.join(GENERATE_ENGINES)}"
            )
        eps = parse_eps(runtime.ep_spec)
        chosen = [
            (name, ep)
            for name in engines or GENERATE_ENGINES
            for ep in eps
            if ep in ("cpu", "cuda") or base_name(name) == "onnxruntime"
        ]
        settings = GenerateSettings(
            cfg,
            preset,
            new_tokens,
            strategy,
            Decoding(new_tokens, eos_id=end_token),
            tuple(chosen),
            runtime.threads or default_threads(),
            artifacts=artifacts or Path("artifacts/bench") / preset / "generation",
            crash_folder=crash_folder,
        )
        check_request(cfg, settings.decoding, strategy)
        run_generate_bench(settings, progress, into=report.data)
        if report.data["crashed"]:
            first = report.data["crashed"][0]
            raise TconformError.with_code(
                f"{first['engine']}/{first['ep']} crashed decoding: {first['reason']}", EXIT_FAILURE
            )
        unavailable = report.data["unavailable"]
        if unavailable and not runtime.allow_missing_ep:
            raise TconformError.with_code(
                f"provider {unavailable[0]['ep']} could not run", EXIT_EP_UNAVAILABLE
            )

    return run
