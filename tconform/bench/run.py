"""One bench run, top to bottom: validate the settings, export every graph variant (cached),
measure each provider's ceiling, time every engine on every case and shape with the same
inputs (bench/measure.py, one row per measurement), profile ONNX Runtime's rows on request,
measure the ceiling again, and sum up the best variant per case and shape (bench/summary.py)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from tconform import registry
from tconform.bench.ceiling import measure_ceiling, remeasure_ceiling
from tconform.bench.engines import (
    BASELINE,
    GRAPH_VARIANTS,
    PLAIN_EXPORT,
    engine_openers,
    engine_rows,
    engine_runtime,
    engine_variant,
    expected_precision,
    parse_engines,
)
from tconform.bench.measure import measure
from tconform.bench.profile import op_profile, outside_matmul_share
from tconform.bench.summary import best_variants, shape_label
from tconform.bench.workload import Workload, case_workload
from tconform.config import ModelConfig, get_preset
from tconform.errors import ProviderUnavailable, UsageError
from tconform.export import (
    ExportJob,
    ExportSettings,
    build_module,
    default_opset,
    export_jobs,
    require_new_or_artifacts,
)
from tconform.folders import BENCH_AREA
from tconform.models import ModelUnderTest, derived_file, model_from_record
from tconform.registry import Case, Shape
from tconform.report.environment import environment, utc_now
from tconform.request import Tolerances, UserModel
from tconform.results import Status
from tconform.runtimes import RUNTIMES, Runtime, make_runtime, require_taken, runtime_class
from tconform.runtimes.providers import parse_eps, unavailable_reason
from tconform.runtimes.specs import base_name
from tconform.suites.module import EXAMPLE

DEFAULT_CASES = ("transformer", "encoder_layer", "decoder_layer", "feed_forward", "mha_self")
DEFAULT_SHAPES = ((1, 32), (8, 128))
# /2: status pass/skip (was ok/skipped), environment block; /3: graph variants as engines
# (details.attention), session_config, a "best" summary per case and shape; /4: a ceiling per
# precision (ceilings.<ep>.precisions), each row's precision and its share of that ceiling,
# best's dtype as what ran and its ratio to the fastest verified torch engine; /5: a user's
# model (settings.module, settings.model): its rows name their input_set, with batch and seq
# null where the model has no such axis; gflop and tokens_per_s null where not counted;
# details.sha256 of the model a row ran.
SCHEMA = "tconform-bench/5"


def ort_defaults(ep: str) -> dict[str, object]:
    """bench's own choice of ONNX Runtime's options where they are not given
    (docs/performance.md): busy-waiting intra-op threads, ONNX Runtime's own default, stated in
    the record (on a quiet machine, where bench is meant to run, they cut the base model's int8
    forward 28 % at 1x32 and 11 % at 8x128, and PyTorch's OpenMP threads spin-wait too; on a
    shared machine `--no-spinning`); subnormal floats flushed (those of the softmax's smallest
    weights slowed the fused Attention 2x on an Intel Xeon, and flushing them changed no output
    bit; the torch engines restore PyTorch's default); and on the CPU provider no Add +
    LayerNormalization fusion (its SkipLayerNormalization kernel measured several times slower
    than the two it replaces; CUDA has its own kernel)."""
    unfused = {"skip_layer_norm_fusion": False} if ep == "cpu" else {}
    return {"spinning": True, "flush_denormals": True, **unfused}


def default_threads() -> int:
    """One intra-op thread per physical core (hyper-threads share the FMA units)."""
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


# A run holds the inputs and outputs several times over (numpy, ONNX Runtime's buffers, torch).
MEMORY_FACTOR = 4


def check_shape(shape: tuple[int, int], cases: tuple[Case, ...], cfg: ModelConfig) -> None:
    """A shape must fit the preset's sequence length and this machine's memory."""
    import psutil

    batch, seq = shape
    if seq > cfg.max_seq_len:
        raise UsageError(
            f"--shape {batch}x{seq}: sequence {seq} exceeds the preset's {cfg.max_seq_len}"
        )
    available = psutil.virtual_memory().available
    for case in cases:
        need = MEMORY_FACTOR * registry.io_bytes(case, cfg, Shape(batch, seq, seq))
        if need > available:
            raise UsageError(
                f"--shape {batch}x{seq}: {case.name} needs about {need / 2**30:.1f} GiB for its "
                f"inputs and outputs; {available / 2**30:.1f} GiB are available here"
            )


def bench_settings(
    preset, cases, shapes, engines, ep_spec, threads, runtime_settings, warmup, runs, seconds,
    artifacts, profile=False, module=None, input_sets=(), crash_folder=None, tolerances=None,
) -> BenchSettings:  # fmt: skip
    """Validate every option before anything slow starts. `module`: a user's model (its
    PACKAGE.MODULE:FACTORY and how its inputs are given; its folder and shapes are the bench's)
    timed at its `input_sets` instead of tconform's cases (its preset, cases and shapes are then
    None, () and ()). `crash_folder`: where an engine in a
    worker that crashes leaves its repro bundle. `runtime_settings`: the options runtimes
    declare that were given (tconform.runtimes.RuntimeOptions.settings)."""
    engines = parse_engines(engines, for_module=module is not None)
    # --threads is the bench's, for every engine
    eps = tuple(parse_eps(ep_spec))
    require_taken([engine_runtime(e) for e in engines], runtime_settings, eps=eps)
    common = dict(
        eps=eps,
        threads=threads or default_threads(),
        runtime_settings=dict(runtime_settings),
        warmup=warmup,
        runs=runs,
        seconds=seconds,
        profile=profile,
        crash_folder=crash_folder,
    )
    if module is not None:
        return module_settings(
            preset, cases, shapes, engines, artifacts, module, input_sets,
            {**common, "tolerances": tolerances},
        )  # fmt: skip
    if tolerances is not None and tolerances.given:
        raise UsageError(
            "--atol, --rtol and --tolerance judge a user's model: give PACKAGE.MODULE:FACTORY "
            "(tconform's cases have their measured rows)"
        )
    if input_sets:
        raise UsageError(
            "--input-set names the input sets of a user's model: give PACKAGE.MODULE:FACTORY"
        )
    cfg = get_preset(preset)
    selected = registry.select_cases(cases or DEFAULT_CASES)
    # The default shapes within the preset's length (tiny's 12: 1x12 and 8x12)
    shapes = tuple(shapes) or tuple(
        dict.fromkeys((batch, min(seq, cfg.max_seq_len)) for batch, seq in DEFAULT_SHAPES)
    )
    for shape in shapes:
        check_shape(shape, selected, cfg)
    settings = BenchSettings(
        preset=preset,
        cfg=cfg,
        cases=selected,
        shapes=shapes,
        engines=engines,
        artifacts=artifacts or Path("artifacts") / BENCH_AREA / preset,
        **common,
    )
    for export in settings.exports:  # every folder, before the first is made
        require_new_or_artifacts(settings.artifacts_for(export))
    return settings


def module_settings(
    preset, cases, shapes, engines: tuple, artifacts, module: UserModel, input_sets, common
) -> BenchSettings:  # fmt: skip
    """A user's model's bench: its engines (parsed), its export folder (tconform check's, as check
    --out names it), the input sets asked for (the example's by default); tconform's own
    cases, shapes and presets are refused, naming the option."""
    from tconform.check_folder import export_folder, require_own_export_folder, require_target

    require_target(module.target)
    for option, given in (("--preset", preset), ("--case", cases), ("--shape", shapes)):
        if given:
            raise UsageError(
                f"{option} chooses among tconform's own cases; a user's model is timed at its "
                f"input sets (--input-set: {EXAMPLE}, batch-1, batch-N, seq-N or all)"
            )
    folder = export_folder(module.target, artifacts)
    require_own_export_folder(folder)  # before the factory runs
    wanted = tuple(dict.fromkeys(input_sets)) or (EXAMPLE,)
    made = [e for e in engines if engine_variant(e) and engine_variant(e).export != PLAIN_EXPORT]
    if module.model is not None and made:
        raise UsageError(
            f"--engine {made[0]} times a model tconform makes from its export; --model times "
            "that file as it is (on the runtimes' plain engines: onnxruntime, openvino, ...)"
        )
    return BenchSettings(
        preset=None,
        cfg=None,
        cases=(),
        shapes=(),
        engines=engines,
        artifacts=folder,
        # the shapes the example never had are made only where one of them is timed
        module=replace(module, out_dir=folder, shapes=wanted != (EXAMPLE,)),
        input_sets=wanted,
        **common,
    )


@dataclass(frozen=True)
class BenchSettings:
    """What one bench run times and how: tconform's `cases` at each of `shapes` (at `preset`),
    or a user's model (`module`) at each of its `input_sets`; the engines, providers and
    timing settings are the same for both."""

    preset: str | None
    cfg: ModelConfig | None
    cases: tuple[Case, ...]
    shapes: tuple[tuple[int, int], ...]
    engines: tuple[str, ...]
    eps: tuple[str, ...]
    threads: int
    runtime_settings: Mapping[str, object]  # the options runtimes declare, as given
    warmup: int
    runs: int | None
    seconds: float
    artifacts: Path
    profile: bool = False
    module: UserModel | None = None
    input_sets: tuple[str, ...] = ()
    crash_folder: Path | None = None  # where an engine in a worker that crashes leaves a bundle
    tolerances: Tolerances | None = None  # a user's model: what --atol, --rtol, --tolerance set

    @property
    def exports(self) -> tuple[tuple[str, str], ...]:
        """The exports, (attention kernel, dtype), that the chosen engines run: each graph
        variant's, and the plain one for the runtimes that run it (or, for tconform's cases,
        when nothing else is; a user's model is exported only for an ONNX engine)."""
        bases = {base_name(e) for e in self.engines}
        used = [v.export for e, v in GRAPH_VARIANTS.items() if e in bases]
        plain = not used and self.module is None
        if plain or any(_runs_plain_export(e) for e in self.engines):
            used.append(PLAIN_EXPORT)
        return tuple(dict.fromkeys(used))

    def artifacts_for(self, export: tuple[str, str]) -> Path:
        """A folder holds one export's graphs: the plain float32 ones in --artifacts, each
        other beside it, named after what differs (base-sdpa, base-int8)."""
        differs = [p for p, plain in zip(export, PLAIN_EXPORT, strict=True) if p != plain]
        if not differs:
            return self.artifacts
        return self.artifacts.with_name("-".join([self.artifacts.name, *differs]))

    def runtime(self, name: str, ep: str, **options: object) -> Runtime:
        """The runtime `name` on `ep` as this bench times it: its threads, the options given
        (else, for ONNX Runtime, bench's own: ort_defaults), and a graph variant's `options`
        (OpenVINO's bf16), of which make_runtime gives each runtime the ones it takes."""
        return make_runtime(
            name,
            ep,
            **{**ort_defaults(ep), **self.runtime_settings, **options},
            threads=self.threads,
            crash_folder=self.crash_folder,
        )

    @property
    def graph_opt(self) -> str:
        """ONNX Runtime's graph-optimisation level: the one given, else its default."""
        default = runtime_class("onnxruntime").graph_opt
        return str(self.runtime_settings.get("graph_opt", default))

    def record(self) -> dict[str, object]:
        if self.module is not None:
            subject = {
                "module": self.module.target,
                "input_sets": list(self.input_sets),
                "export_folder": str(self.artifacts),
            }
        else:
            subject = {
                "preset": self.preset,
                "cases": [c.name for c in self.cases],
                "shapes": [f"{b}x{s}" for b, s in self.shapes],
            }
        return {
            **subject,
            "engines": list(self.engines),
            "eps": list(self.eps),
            "intra_op_threads": self.threads,
            "torch_threads": self.threads,
            "graph_optimization": self.graph_opt,
            "runtime_options": dict(self.runtime_settings),
            "session_config": self.runtime(BASELINE, "cpu").config_entries(),
            "disabled_optimizers": {
                ep: list(self.runtime(BASELINE, ep).disabled()) for ep in self.eps
            },
            "warmup": self.warmup,
            "runs": self.runs,
            "seconds": self.seconds,
        }


Log = Callable[[str], None]
# A progress bar over `length` measurements (the command passes click.progressbar).
ProgressBar = Callable[[int], AbstractContextManager]


def run_bench(
    settings: BenchSettings,
    log: Log,
    progress_bar: ProgressBar,
    into: dict | None = None,
    on_change: Callable[[dict], None] = lambda report: None,
    on_start: Callable[[dict, str], None] = lambda row, what: None,
) -> dict:
    """The whole report: environment, ceilings, unavailable providers, one row per timing, and
    the best variant per case and shape. `into` (when given) is that report, filled as the run
    goes, so that a run stopped early (Ctrl-C, an error) still reports what it measured;
    `on_change(report)` is called each time it grows (a user's model is timed in a child
    process, which sends it to the command's); `on_start(row, what)` before each timing (the row
    as far as it is known before it runs), so that a process that dies inside one is known to
    have died there."""
    try:
        # a user's model's export folder is locked from its first export to the run's end
        with contextlib.ExitStack() as locks:
            report = {} if into is None else into
            return _measure_all(settings, log, progress_bar, report, on_change, on_start, locks)
    finally:
        # The calling thread back to subnormals kept, whatever ONNX Runtime set on it.
        torch.set_flush_denormal(False)


def _measure_all(
    settings: BenchSettings,
    log: Log,
    progress_bar: ProgressBar,
    report: dict,
    on_change: Callable[[dict], None],
    on_start: Callable[[dict, str], None],
    locks: contextlib.ExitStack,
) -> dict:
    started = utc_now()
    rows: list[dict] = []
    load = {"cores": os.cpu_count(), "threads": settings.threads, "at_start": _load()}
    report.update(
        tool="tconform bench",
        load=load,
        schema=SCHEMA,
        environment=environment(started, settings.threads),
        settings=settings.record(),
        results=rows,
    )
    torch.set_num_threads(settings.threads)
    workloads, count, module_ep = _workloads(settings, log, report["settings"], locks)
    ceilings, unavailable = _ceilings(settings, log)
    report.update(
        ceiling=ceilings.get("cpu") or next(iter(ceilings.values()), {}),
        ceilings=ceilings,
        unavailable=unavailable,
    )
    on_change(report)
    timing = {"warmup": settings.warmup, "runs": settings.runs, "seconds": settings.seconds}
    eps = tuple(ceilings)
    measurements = count * len(engine_rows(settings.engines, eps, settings.runtime, module_ep))
    with progress_bar(measurements) as bar:
        for workload in workloads:
            rows += module_elsewhere(settings.engines, eps, workload)
            openers = engine_openers(settings.engines, eps, workload, settings.runtime)
            for engine, ep, opener in openers:
                what = f"{workload.case} {workload.shape} {engine}/{ep}"
                on_start(
                    {"case": workload.case, "engine": engine, "ep": ep, **workload.shape_fields()},
                    f"timing {what}",
                )
                row = measure(workload, engine, ep, opener, ceilings[ep], timing)
                row.update(threads=settings.threads, graph_opt=_graph_opt(settings, engine))
                rows.append(row)
                on_change(report)
                bar.update(1)
                if row["status"] != Status.PASS:  # skipped, rejected, or its worker crashed
                    log(f"  {what}: {row['status']}: {row['reason']}")
                    continue
                log(f"  {what}: p50 {row['p50_ms']} ms, p90 {row['p90_ms']} ms")
                if row.get("accuracy", {}).get("status") == Status.FAIL:
                    log(f"  {what}: outputs outside the {_row_name(row)} tolerance row")
                if settings.profile and _runs_on(engine) == BASELINE:
                    _profile(settings, row, workload.feeds, log)
    for ep, ceiling in ceilings.items():
        log(f"measuring the {ep} GEMM ceilings again ...")
        remeasure_ceiling(settings.runtime, ep, ceiling, rows)
    report["best"] = best_variants(rows)
    load["at_end"] = _load()
    on_change(report)
    return report


def _load() -> float | None:
    """The machine's 1-minute load average (None where the system keeps none): other work
    beside the bench slows torch more than ONNX Runtime, and a ratio measured so flatters."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _workloads(
    settings: BenchSettings, log: Log, record: dict, locks: contextlib.ExitStack
) -> tuple[Iterable[Workload], int, str | None]:
    """What the run times, its models exported first: the workloads, how many, and the one
    provider the module runtimes run on (None: each). tconform's cases: one per case and
    shape, made as they are timed (a case's weights are held while it is); a user's model: one
    per input set, its module where the user put it (what it is joins `record`)."""
    if settings.module is None:
        models = _export(settings, log)

        def made() -> Iterator[Workload]:
            for case in settings.cases:
                _, params = build_module(case, ExportSettings(settings.cfg))
                of_case = {export: found[case.name] for export, found in models.items()}
                for batch, seq in settings.shapes:
                    yield case_workload(
                        case, settings.cfg, params, batch, seq, of_case, settings.preset
                    )

        return made(), len(settings.cases) * len(settings.shapes), None
    from tconform.bench.module import module_workloads

    dtypes = tuple(dtype for _, dtype in settings.exports)
    found = module_workloads(
        settings.module, dtypes, settings.input_sets, log, record, settings.tolerances, locks
    )
    return found, len(found), found[0].module_ep


def _export(settings: BenchSettings, log: Log) -> dict[tuple[str, str], dict[str, ModelUnderTest]]:
    """{export (attention kernel, dtype): {case: model}} for every export the engines run."""
    log(
        f"exporting {len(settings.cases)} models x {len(settings.exports)} exports "
        f"({', '.join(' '.join(e) for e in settings.exports)}) at preset {settings.preset} "
        "(cached; the base whole model is ~400 MB and takes a minute per export) ..."
    )
    jobs = [
        ExportJob(
            case,
            ExportSettings(
                settings.cfg, opset=default_opset(attention), dtype=dtype, attention=attention
            ),
            settings.artifacts_for((attention, dtype)),
        )
        for attention, dtype in settings.exports
        for case in settings.cases
    ]
    records = export_jobs(
        jobs, on_done=lambda r: log(f"  {r.location}: {'reused' if r.cached else 'exported'}")
    )
    models: dict[tuple[str, str], dict[str, ModelUnderTest]] = {}
    for job, record in zip(jobs, records, strict=True):
        model = model_from_record(job.case, record)
        export = (job.settings.attention, job.settings.dtype)
        models.setdefault(export, {})[job.case.name] = model
    return models


def module_elsewhere(
    engines: tuple[str, ...], eps: tuple[str, ...], workload: Workload
) -> list[dict]:
    """A skipped row per module engine where the user's module lies on a provider this run
    does not time (a CUDA module, ONNX Runtime's CUDA provider absent or not asked for): the
    module runtimes run it where it is, so they have no row, and the table says why."""
    if workload.module_ep is None or workload.module_ep in eps:
        return []
    reason = (
        f"the module is on {workload.module_ep}, a provider this run does not time (its "
        f"providers: {', '.join(eps) or 'none'}); the torch engines run it where it is"
    )
    return [
        {"case": workload.case, "engine": engine, "ep": workload.module_ep,
         **workload.shape_fields(), "status": Status.SKIP.value, "reason": reason}
        for engine in engines
        if engine in RUNTIMES and runtime_class(engine).consumes == "module"
    ]  # fmt: skip


def _ceilings(settings: BenchSettings, log: Log) -> tuple[dict[str, dict], list[dict[str, str]]]:
    """The measured ceilings of every provider that runs, one per precision its engines compute
    in; the reason for each provider that does not run."""
    ceilings: dict[str, dict] = {}
    unavailable: list[dict[str, str]] = []
    for ep in settings.eps:
        reason = unavailable_reason(ep)
        if reason is None:
            precisions = tuple(
                dict.fromkeys(
                    expected_precision(engine, ep, settings.runtime)
                    for engine in settings.engines
                    if ep in runtime_class(_runs_on(engine)).eps
                )
            )
            try:
                log(
                    f"measuring the {ep} GEMM ceilings ({', '.join(precisions)}) and memory "
                    "bandwidth ..."
                )
                ceilings[ep] = measure_ceiling(settings.runtime, ep, precisions)
                continue
            except ProviderUnavailable as exc:
                reason = str(exc)
        log(f"provider {ep} unavailable, not timed: {reason}")
        unavailable.append({"ep": ep, "reason": reason})
    return ceilings, unavailable


def _row_name(row: dict) -> str:
    return f"{row['accuracy']['precision']}/{row['accuracy']['tolerance']}"


def _runs_on(engine: str) -> str:
    """The runtime an engine runs on (a graph variant's, else the engine's own name)."""
    return base_name(engine_runtime(engine))


def _runs_plain_export(engine: str) -> bool:
    """Whether an engine that is no graph variant runs the plain export (OpenVINO does; the
    module runtimes run no export)."""
    engine = base_name(engine)
    if engine in GRAPH_VARIANTS or engine not in RUNTIMES:
        return False
    return runtime_class(engine).consumes == "onnx"


def _graph_opt(settings: BenchSettings, engine: str) -> str | None:
    return settings.graph_opt if engine.startswith("onnxruntime") else None


def _profile(settings: BenchSettings, row: dict, feeds: dict[str, np.ndarray], log: Log) -> None:
    """ONNX Runtime's per-op profile of the row's graph, and its share outside matrix products."""
    log(f"  profiling {row['case']} {shape_label(row)} {row['engine']}/{row['ep']} ...")
    model = derived_file(Path(row["details"]["model"]))
    runtime = settings.runtime(engine_runtime(row["engine"]), row["ep"])
    row["profile"] = op_profile(runtime, model, feeds)
    row["outside_matmul_share"] = outside_matmul_share(row["profile"])
