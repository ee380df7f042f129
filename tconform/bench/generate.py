"""`tconform bench --generate N`: how fast each engine decodes, token by token.

For batch 1 and a source of 32 tokens (the preset's maximum if shorter), each engine decodes
N new tokens with the chosen strategy (default greedy, no end token, so every run makes N
tokens) twice: with the key/value cache and with the whole prefix each step. Every step call
is timed. The engines are the bench's that decode: ONNX Runtime on the float32, int8 and int4
exports of the generation models, OpenVINO at float32 and at its bf16 inference precision,
torch eager, torch's dynamic int8 and torch under bfloat16 autocast.

Per engine the report gives the encoder latency, per-token p50/p90 with and without the cache,
tokens/s, the cache's bytes after N tokens, the per-token time at each prefix length (plotted),
the cached step's ratio to torch eager's own cached step, and the memory floor per token: the
weight bytes the engine's own decoder step reads (its file's initializers or its module's
tensors, one embedding row) over the measured copy bandwidth of the memory it reads them from
(the host's, or a GPU's own: tconform.bench.ceiling), and the cached step's multiple of it.
Each engine is also judged: fed the float64 oracle's greedy tokens (teacher forcing, untimed),
its step log-probabilities against the oracle's under the generation tolerance of the precision
it computes in (`verified`), with the share of steps whose top token is the oracle's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from tconform.bench.ceiling import copy_bandwidth_gbs, cpu_name, device_copy_bandwidth_gbs
from tconform.bench.engines import engine_runtime, engine_variant, weight_counter
from tconform.bench.report import (
    BenchReport,
    compared_versions,
    ending,
    is_own_json,
    is_own_markdown,
    version_lines,
)
from tconform.bench.timing import round_sig, timed_runs
from tconform.compare import compare_output
from tconform.config import ModelConfig
from tconform.errors import WorkerCrashed
from tconform.execution import NotRun, Subject, case_module, open_subject
from tconform.export import ExportJob, ExportSettings, export_jobs
from tconform.files import atomic_write_json, atomic_write_text
from tconform.folders import BENCH_AREA, GENERATION_AREA
from tconform.generation.driver import (
    Decoding,
    Strategy,
    check_request,
    generate,
    teacher_forced,
)
from tconform.generation.steppers import CachedStepper, make_stepper, oracle_sessions
from tconform.generation.verdict import step_tolerance
from tconform.models import ModelUnderTest, model_from_record
from tconform.quality import top1_agreement
from tconform.reference import Transformer
from tconform.registry import ENCODER, GENERATION_CASES, STEP, Shape
from tconform.report.formats import Writer
from tconform.results import Status
from tconform.runtimes import label, make_runtime, runtime_class
from tconform.runtimes.providers import DEVICE_TYPES
from tconform.runtimes.specs import base_name
from tconform.weights import DEFAULT_SEED, make_params

# The engines that decode: the bench's, where the generation models have the export. The
# default is the float32 pair; the rest are named with --engine.
GENERATE_ENGINES = (
    "onnxruntime",
    "onnxruntime-int8",
    "onnxruntime-int4",
    "openvino",
    "openvino-bf16",
    "torch",
    "torch-int8",
    "torch-bf16",
)
DEFAULT_GENERATE_ENGINES = ("onnxruntime", "torch")
EAGER = "torch"  # torch eager float32's cached step: the peer every ratio is to


@dataclass(frozen=True)
class DecodeEngine:
    """A bench engine as decoding runs it: its runtime, the export its ONNX runtimes read
    (dtype), the runtime's options and the precision it must read back (openvino-bf16)."""

    name: str
    runtime: str
    dtype: str = "float32"
    options: tuple[tuple[str, object], ...] = ()
    precision: str | None = None

    @classmethod
    def named(cls, name: str) -> DecodeEngine:
        """The engine `name`, or a release of it (onnxruntime-int8==1.20.1: in a worker)."""
        variant = engine_variant(name)
        if variant is None:
            return cls(name, name)
        return cls(name, engine_runtime(name), variant.dtype, variant.options, variant.precision)

    @property
    def reads_onnx(self) -> bool:
        return runtime_class(self.runtime).consumes == "onnx"


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
    """Weight bytes one float32 decoder step reads, from the config: the step model's
    parameters, of the target embedding only the one row a new token gathers."""
    return STEP.weight_bytes_read(cfg, Shape(1, 1, 1))


@dataclass(frozen=True)
class GenerateSettings:
    cfg: ModelConfig
    preset: str
    new_tokens: int
    strategy: Strategy
    decoding: Decoding
    engines: tuple[tuple[str, str], ...]  # (engine name, ep)
    threads: int
    runtime_settings: Mapping[str, object] = field(default_factory=dict)  # declared, as given
    batch: int = 1
    src_len: int = 32
    repeats: int = 3
    artifacts: Path = Path("artifacts") / BENCH_AREA / "base" / GENERATION_AREA
    crash_folder: Path | None = None  # where an engine in a worker that crashes leaves a bundle

    def folder(self, dtype: str) -> Path:
        """Where the generation models of `dtype` are exported (float32: --artifacts)."""
        if dtype == "float32":
            return self.artifacts
        return self.artifacts.with_name(f"{self.artifacts.name}-{dtype}")


def _decode_times(stepper, inputs, settings: GenerateSettings) -> list[list[float]]:
    """Per step, the seconds of each repeat (after one untimed warm-up decode)."""
    runs = []
    for _ in range(settings.repeats + 1):
        generate(stepper, *inputs, settings.decoding, settings.strategy)
        runs.append([seconds for _, seconds in stepper.times])
    return [list(step) for step in zip(*runs[1:], strict=True)]


def _decode_row(engine, runtime, sessions, cfg, settings, feeds, ep: str) -> dict:
    """One engine's row: the encoder's latency and each step's, with and without the cache."""
    src_ids, src_keep = feeds["src_ids"], feeds["src_keep"]
    encoder = timed_runs(lambda: sessions[ENCODER.name].run(feeds), warmup=1, runs=5)
    per_step = {}
    for cache in (True, False):
        stepper = TimedStepper(make_stepper(sessions, cfg, cache))
        per_step[cache] = _decode_times(stepper, (src_ids, src_keep), settings)
        if isinstance(stepper.inner, CachedStepper):
            cached = stepper.inner
    row = {
        "engine": engine.name,
        "ep": ep,
        "label": label(runtime),
        "precision": sessions[STEP.name].precision,
        "settings": runtime.settings(),
        "model": _model_of(sessions[STEP.name]),
        # the exact bytes of each of the three models it ran (path, sha256, origin)
        "models": {
            name: opened.provenance.to_dict()
            for name, opened in sessions.items()
            if opened.provenance is not None
        },
    }
    versions = runtime.versions()  # a runtime in a worker: its exact packages
    if versions is not None:
        row["versions"] = versions
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
    count = weight_counter(sessions[STEP.name])
    if count is not None:
        row["step_weight_bytes"] = count(settings.batch)
    return row


def _model_of(opened) -> str:
    """What the step ran: its ONNX file, or the module's class."""
    return str(opened.subject.onnx.path) if opened.onnx_file else opened.provenance.path


def _judged(sessions, cfg, feeds, oracle, precision: str) -> dict[str, object]:
    """The engine fed the oracle's greedy tokens: its step log-probabilities against the
    oracle's under the generation tolerance of its precision, and its top-1 agreement."""
    stepper = make_stepper(sessions, cfg, cache=True)
    forced = teacher_forced(stepper, feeds["src_ids"], feeds["src_keep"], oracle.tokens)
    tolerance = step_tolerance(precision)
    comparison = compare_output("log_probs", forced, oracle.log_probs, tolerance)
    where = np.ones(oracle.tokens.shape, dtype=bool)
    return {
        "status": comparison.status,
        "precision": precision,
        "atol": tolerance.atol,
        "rtol": tolerance.rtol,
        "min_sqnr_db": tolerance.min_sqnr_db,
        "max_abs_err": comparison.max_abs_err,
        "sqnr_db": comparison.sqnr_db,
        "tolerance_used": comparison.tolerance_used,
        "top1_agreement": top1_agreement(oracle.log_probs, forced, where),
    }


KIND = "tconform-bench-generate"


def _export(settings: GenerateSettings, dtypes: list[str]) -> dict[str, dict[str, ModelUnderTest]]:
    """{dtype: {generation case: model}} for every export the engines read."""
    jobs = [
        ExportJob(
            case, ExportSettings(settings.cfg, DEFAULT_SEED, dtype=dtype), settings.folder(dtype)
        )
        for dtype in dtypes
        for case in GENERATION_CASES
    ]
    models: dict[str, dict[str, ModelUnderTest]] = {}
    for job, record in zip(jobs, export_jobs(jobs), strict=True):
        model = model_from_record(job.case, record)
        models.setdefault(job.settings.dtype, {})[job.case.name] = model
    return models


def run_generate_bench(settings: GenerateSettings, log, into: dict | None = None) -> dict:
    """The report (`into`, filled as the run goes, when given): one row per engine."""
    report = {} if into is None else into
    cfg = settings.cfg
    check_request(cfg, settings.decoding, settings.strategy)
    engines = [(DecodeEngine.named(name), ep) for name, ep in settings.engines]
    dtypes = list(dict.fromkeys(e.dtype for e, _ in engines if e.reads_onnx))
    log(
        f"generation models ({', '.join(dtypes)}) beside {settings.artifacts}: exported where "
        "not current ..."
    )
    models = _export(settings, dtypes)
    params = make_params(Transformer(cfg), DEFAULT_SEED)
    rng = np.random.default_rng(0)
    src_len = min(settings.src_len, cfg.max_seq_len)
    src_ids = rng.integers(3, cfg.src_vocab, (settings.batch, src_len), dtype=np.int64)
    src_keep = np.ones_like(src_ids, dtype=bool)
    feeds = {"src_ids": src_ids, "src_keep": src_keep}
    log("float64 oracle: greedy decoding (the tokens every engine is judged on)")
    oracle_stepper = make_stepper(oracle_sessions(cfg, params), cfg, cache=True, oracle=True)
    greedy = Decoding(settings.new_tokens, eos_id=None)  # every step scored: no early end
    oracle = generate(oracle_stepper, src_ids, src_keep, greedy, Strategy("greedy"))
    float32_bytes = decoder_step_weight_bytes(cfg)
    bandwidth = copy_bandwidth_gbs()
    # A device's rows stream their weights from its own memory: their floor is its bandwidth.
    device_id = int(settings.runtime_settings.get("device_id", 0))
    bandwidths = {
        ep: device_copy_bandwidth_gbs(ep, device_id)
        for ep in dict.fromkeys(ep for _, ep in engines if ep in DEVICE_TYPES)
    }
    rows, unavailable, skipped, crashed = [], [], [], []
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
            "step_weight_bytes": float32_bytes,
            "copy_bandwidth_gbs": round_sig(bandwidth),
            "device_copy_bandwidth_gbs": {
                ep: round_sig(gbs) for ep, gbs in bandwidths.items() if gbs
            },
            "memory_floor_ms": round_sig(float32_bytes / (bandwidth * 1e6)),
            "rows": rows,
            "unavailable": unavailable,  # providers that cannot run (exit 3)
            "skipped": skipped,  # engines that cannot run as themselves here, with the reason
            "crashed": crashed,  # engines whose worker process died, with how (exit 1)
        }
    )
    for engine, ep in engines:
        runtime = make_runtime(
            engine.runtime, ep, threads=settings.threads, crash_folder=settings.crash_folder,
            **{**settings.runtime_settings, **dict(engine.options)},
        )  # fmt: skip
        if engine.precision is not None and runtime.precision != engine.precision:
            why = (
                f"not available: {runtime.name} computes {runtime.precision}, not "
                f"{engine.precision}, on this CPU (no native kernels for it); not timed"
            )
            skipped.append({"engine": engine.name, "ep": ep, "reason": why})
            continue
        log(
            f"{engine.name} ({label(runtime)}): decoding {settings.new_tokens} tokens with and "
            "without the cache"
        )
        with ExitStack() as stack:
            try:
                sessions = {
                    case.name: stack.enter_context(
                        open_subject(
                            runtime,
                            Subject(
                                models[engine.dtype][case.name] if engine.reads_onnx else None,
                                case_module(case, cfg, params),
                            ),
                        )
                    )
                    for case in GENERATION_CASES
                }
                row = _decode_row(engine, runtime, sessions, cfg, settings, feeds, ep)
                row["accuracy"] = _judged(sessions, cfg, feeds, oracle, row["precision"])
            except NotRun as why:  # a provider that cannot run, a kernel it lacks, a crash
                if why.status == Status.CRASH:
                    missing = crashed
                else:
                    missing = unavailable if why.status == Status.UNAVAILABLE else skipped
                missing.append({"engine": engine.name, "ep": ep, "reason": str(why)})
                continue
            except WorkerCrashed as exc:  # its worker died decoding: a verdict, the run goes on
                crashed.append({"engine": engine.name, "ep": ep, "reason": str(exc)})
                continue
        # a provider without memory of its own reads its weights from the host's
        row_bandwidth = bandwidths.get(ep, bandwidth)
        if "step_weight_bytes" in row and row_bandwidth:
            row["memory_floor_ms"] = round_sig(row["step_weight_bytes"] / (row_bandwidth * 1e6))
            row["floor_ratio"] = round_sig(row["cached_p50_ms"] / row["memory_floor_ms"])
        rows.append(row)
    _relate(report)
    return report


def _relate(report: dict) -> None:
    """Each row's cached step over torch eager's, and the fastest verified engine."""
    rows = report["rows"]
    eager = next((r for r in rows if r["engine"] == EAGER), None)
    if eager is not None:
        for row in rows:
            row["vs_torch_cached"] = round_sig(row["cached_p50_ms"] / eager["cached_p50_ms"])
    verified = [r for r in rows if r["accuracy"]["status"] == Status.PASS]
    if verified:
        fastest = min(verified, key=lambda r: r["cached_p50_ms"])
        report["fastest_verified"] = {
            key: fastest.get(key)
            for key in ("engine", "precision", "cached_p50_ms", "vs_torch_cached", "floor_ratio")
        }


def table(report: dict) -> str:
    """One line per engine, then the unavailable and crashed ones with the reason, the float32
    floor and the fastest verified engine against torch eager's cached step and its own
    floor."""
    from tconform.report.text import format_table

    header = ["engine", "computes in", "judged", "encoder ms", "cached p50/p90 ms",
              "no-cache p50/p90 ms", "tokens/s", f"x faster @{report['new_tokens']}",
              "x torch cached", "step MB", "floor ms", "x floor", "cache MiB",
              "cache on"]  # fmt: skip
    body = [
        [
            r["engine"],
            r["precision"],
            r["accuracy"]["status"],
            str(r["encoder_ms"]),
            f"{r['cached_p50_ms']}/{r['cached_p90_ms']}",
            f"{r['no_cache_p50_ms']}/{r['no_cache_p90_ms']}",
            str(r["tokens_per_s"]),
            str(r["speedup_at_last_token"]),
            str(r.get("vs_torch_cached", "-")),
            f"{r['step_weight_bytes'] / 1e6:.2f}" if "step_weight_bytes" in r else "-",
            str(r.get("memory_floor_ms", "-")),
            str(r.get("floor_ratio", "-")),
            f"{r['cache_bytes'] / 2**20:.2f}",
            r["cache_on"],
        ]
        for r in report["rows"]
    ]
    lines = [format_table(header, body)]
    missing = [*report.get("unavailable", []), *report.get("skipped", [])]
    lines += [f"{u['engine']}/{u['ep']}: {u['reason']}" for u in missing]
    lines += [f"{u['engine']}/{u['ep']}: crashed: {u['reason']}" for u in report.get("crashed", [])]
    lines.append(
        f"float32 memory floor per token {report['memory_floor_ms']} ms = "
        f"{report['step_weight_bytes'] / 1e6:.3g} MB of decoder-step weights / "
        f"{report['copy_bandwidth_gbs']} GB/s copy bandwidth ({report['cpu']}); each row's "
        "floor is its own step's weight bytes"
    )
    lines += [
        f"{ep} rows: floor at the device's own copy bandwidth, {gbs} GB/s (torch)"
        for ep, gbs in report.get("device_copy_bandwidth_gbs", {}).items()
    ]
    fastest = report.get("fastest_verified")
    if fastest:
        text = (
            f"fastest verified: {fastest['engine']} ({fastest['precision']}) cached step "
            f"{fastest['cached_p50_ms']} ms"
        )
        if fastest.get("vs_torch_cached") is not None:
            text += f", {fastest['vs_torch_cached']}x torch eager's cached step"
        if fastest.get("floor_ratio") is not None:
            text += f", {fastest['floor_ratio']}x its own memory floor"
        lines.append(text)
    lines += version_lines(report)
    return "\n".join(lines)


def markdown(report: dict) -> str:
    """The table for CI job summaries (in a code block: it is the terminal's)."""
    lines = ["## tconform bench --generate", ""]
    error = report.get("error")
    if error:
        lines += [f"**{ending(error)}:** {error['message']}", ""]
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
        (line,) = ax.plot(steps, row["cached_by_prefix_ms"], label=f"{row['engine']} with cache")
        ax.plot(steps, row["no_cache_by_prefix_ms"], "--", color=line.get_color(),
                label=f"{row['engine']} no cache")  # fmt: skip
        if "memory_floor_ms" in row:  # its own step's weight bytes / copy bandwidth
            ax.axhline(row["memory_floor_ms"], color=line.get_color(), linewidth=0.8,
                       linestyle=":", label=f"{row['engine']} memory floor")  # fmt: skip
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
    atomic_write_text(path, markdown(report.to_dict()))


def _is_own_markdown(path: Path) -> bool:
    return is_own_markdown(path, "## tconform bench --generate")


def _is_own_plot(path: Path) -> bool:
    from tconform.report import png

    return png.is_own(path)


JSON = Writer(write_json, is_own_json)
MARKDOWN = Writer(write_markdown, _is_own_markdown)
PLOT = Writer(write_plot, _is_own_plot)


def _step(row: dict) -> tuple[str, str, str]:
    """Where a generation row's releases are compared: the cached step on its provider."""
    return "generation", "cached step", row["ep"]


class GenerateReport(BenchReport):
    """`bench --generate`'s report kind for the run frame: `data` is run_generate_bench's report
    (filled as the run goes), `error` what ended it early."""

    writers: ClassVar[dict[str, str]] = {
        "json": "tconform.bench.generate:JSON",
        "markdown": "tconform.bench.generate:MARKDOWN",
        "plot": "tconform.bench.generate:PLOT",
    }

    def blank(self) -> dict:
        return {
            "tool": "tconform bench",
            "kind": KIND,
            "environment": self.environment,
            "rows": [],
            "unavailable": [],
            "skipped": [],
            "crashed": [],
        }

    def to_dict(self) -> dict:
        """The report, with each engine's releases' cached step p50 side by side."""
        report = super().to_dict()
        return {**report, "versions": compared_versions(report["rows"], _step, "cached_p50_ms")}

    def render(self) -> str:
        report = self.to_dict()
        return table(report) if report["rows"] else ""


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
    request (UsageError: one line, exit 2), measure into the report, exit 1 where an engine's
    worker crashed or its log-probabilities left their tolerance row, and 3 where a requested
    provider could not run. `runtime` is the command's RuntimeChoice; `crash_folder` where a
    crashed worker's repro bundle goes."""

    def run(report: GenerateReport, progress) -> None:
        from tconform.bench.accuracy import require_within_tolerance
        from tconform.bench.run import default_threads
        from tconform.config import get_preset
        from tconform.errors import EXIT_EP_UNAVAILABLE, EXIT_FAILURE, TconformError, UsageError
        from tconform.runtimes import require_taken
        from tconform.runtimes.providers import parse_eps

        cfg = get_preset(preset)
        unknown = [e for e in engines if base_name(e) not in GENERATE_ENGINES]
        if unknown:
            raise UsageError(
                f"engine {unknown[0]!r} does not decode; choose from {', '.join(GENERATE_ENGINES)}"
            )
        runs_on = [DecodeEngine.named(name).runtime for name in engines or DEFAULT_GENERATE_ENGINES]
        eps = parse_eps(runtime.ep_spec)
        # --threads: the bench's, for every engine
        require_taken(runs_on, runtime.settings, eps=eps)
        chosen = [
            (name, ep)
            for name in engines or DEFAULT_GENERATE_ENGINES
            for ep in eps
            if ep in runtime_class(DecodeEngine.named(name).runtime).eps
        ]
        settings = GenerateSettings(
            cfg,
            preset,
            new_tokens,
            strategy,
            Decoding(new_tokens, eos_id=end_token),
            tuple(chosen),
            runtime.threads or default_threads(),
            dict(runtime.settings),
            artifacts=artifacts or Path("artifacts") / BENCH_AREA / preset / GENERATION_AREA,
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
        require_within_tolerance(report.data["rows"])

    return run
