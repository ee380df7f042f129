"""`tconform verify --generation`: decode every generation golden on every runtime, with the
key/value cache and without it, and judge the tokens (tconform.generation.verdict).

The models are exported (or reused) into <artifacts>/generation, and for the sets whose mask
fill differs from the preset's into <artifacts>/generation-fill<fill>: the fill is part of the
model. `--no-export` takes those folders as they are; `--model gen_step=PATH` (or gen_encoder,
gen_prefix) runs a given file, read-only, on the goldens of the preset's own mask fill (a model
holds one fill). Every result names the decoder model that ran (path, sha256, origin).

The goldens are decoded with the weights of a trained checkpoint (recorded in their manifest,
tconform.generation.golden); the exports hold the same weights (ExportSettings.checkpoint, part
of the cache key), and PyTorch runs the modules with them.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import numpy as np

from tconform.compare import TOLERANCES, Tolerance, tolerance_for
from tconform.config import ModelConfig
from tconform.errors import TconformError, UsageError, WorkerCrashed, first_line
from tconform.execution import NotRun, Subject, case_module, not_run, open_subject
from tconform.export import (
    ExportJob,
    ExportRecord,
    ExportSettings,
    cache_key,
    export_jobs,
    read_artifacts_manifest,
)
from tconform.files import sha256_file
from tconform.generation import golden
from tconform.generation.driver import DegenerateOutput, generate
from tconform.generation.steppers import make_stepper
from tconform.generation.verdict import Verdict, judge
from tconform.models import ModelUnderTest, given_model, held_model, model_from_record
from tconform.plan import Progress, request_runtimes
from tconform.registry import GENERATION_CASES, PREFIX, STEP, generation_case
from tconform.report import RunReport
from tconform.request import Request
from tconform.results import Result, Status, allow_missing
from tconform.runtimes import label

GOLDEN_DIR = Path("golden-generation")


def step_tolerance(precision: str) -> Tolerance:
    """The tolerance of a generation model's step log-probabilities: the "generation" row of
    tconform.compare.TOLERANCES where the precision has one, else its "model" row."""
    return TOLERANCES.get((precision, "generation")) or tolerance_for(precision, "model")


def model_folder(artifacts_dir: Path, cfg: ModelConfig, preset_cfg: ModelConfig) -> Path:
    if cfg.mask_fill == preset_cfg.mask_fill:
        return artifacts_dir / "generation"
    return artifacts_dir / f"generation-fill{cfg.mask_fill}"


def export_settings(cfg: ModelConfig, seed: int, checkpoint: str) -> ExportSettings:
    """The generation models' export: float32, with the checkpoint's weights."""
    return ExportSettings(cfg, seed, checkpoint=checkpoint)


def export_models(
    configs: list[ModelConfig],
    preset_cfg: ModelConfig,
    seed: int,
    artifacts_dir: Path,
    progress,
    checkpoint: str = golden.CHECKPOINT,
) -> dict[tuple[ModelConfig, str], ExportRecord]:
    """Every generation model of every config, exported where not current, in one pool."""
    jobs = [
        ExportJob(
            case,
            export_settings(cfg, seed, checkpoint),
            model_folder(artifacts_dir, cfg, preset_cfg),
        )
        for cfg in configs
        for case in GENERATION_CASES
    ]
    records = export_jobs(
        jobs, on_done=lambda r: progress(f"  {r.location}: {'reused' if r.cached else 'exported'}")
    )
    return {(job.settings.cfg, job.case.name): r for job, r in zip(jobs, records, strict=True)}


def models_under_test(
    request: Request,
    configs: list[ModelConfig],
    preset_cfg: ModelConfig,
    seed: int,
    checkpoint: str,
    progress,
) -> dict[tuple[ModelConfig, str], ModelUnderTest]:
    """The file each generation model of each config runs: a given one (checked before any
    export), the artifacts folder's as it is (--no-export), or tconform's export."""
    chosen = {
        (preset_cfg, name): given_model(generation_case(name), preset_cfg, path)
        for name, path in request.subject.models.items()
    }
    for (_, name), model in chosen.items():
        if model.precision != "float32":  # the steppers hold a float32 cache
            raise UsageError(f"{model.path}: a {model.precision} model; generation checks float32")
        progress(
            f"  {name}: the given model {model.path} (sha256 {model.provenance.sha256[:12]}), "
            f"on the goldens of mask fill {preset_cfg.mask_fill} (a model holds one fill)"
        )
    if not request.subject.export:
        for cfg in configs:
            folder = model_folder(request.subject.artifacts_dir, cfg, preset_cfg)
            manifest = read_artifacts_manifest(folder)
            for case in GENERATION_CASES:
                if (cfg, case.name) not in chosen:
                    key = cache_key(case, export_settings(cfg, seed, checkpoint))
                    chosen[cfg, case.name] = held_model(case, cfg, folder, manifest, key)
        return chosen
    folder = request.subject.artifacts_dir
    records = export_models(configs, preset_cfg, seed, folder, progress, checkpoint)
    for (cfg, name), record in records.items():
        chosen.setdefault((cfg, name), model_from_record(generation_case(name), record))
    return chosen


def verify_generation(
    request: Request,
    golden_dir: Path,
    report: RunReport,
    progress: Progress = lambda _: None,
) -> None:
    preset_cfg, seed, recorded, cases = golden.read_cases(golden_dir)
    checkpoint = golden.require_current_checkpoint(golden_dir, recorded)
    configs = list(dict.fromkeys(golden.set_config(preset_cfg, c.source_set) for c in cases))
    runtimes = request_runtimes(request)
    report.settings = {
        "golden_generation": str(golden_dir),
        "golden_manifest_sha256": sha256_file(golden_dir / "manifest.json"),
        "artifacts": str(request.subject.artifacts_dir),
        "config": preset_cfg.to_dict(),
        "seed": seed,
        "checkpoint": recorded,
        "eps": list(request.runtimes.eps),
        "runtimes": {label(r): r.settings() for r in runtimes},
        "cases": [c.name for c in cases],
    }
    progress(
        f"generation models for {len(configs)} mask fill(s) in {request.subject.artifacts_dir}"
    )
    models = models_under_test(request, configs, preset_cfg, seed, checkpoint, progress)
    for cfg in configs:
        params = golden.golden_params(cfg, checkpoint)
        for runtime in runtimes:
            own = [c for c in cases if golden.set_config(preset_cfg, c.source_set) == cfg]
            report.results += _runtime_results(runtime, cfg, params, models, own, progress)
    if request.allow_missing_ep:
        report.results = allow_missing(report.results)


def _runtime_results(runtime, cfg, params, models, cases, progress) -> list[Result]:
    """Every case decoded on `runtime`, with and without the cache, judged token for token."""
    subjects = {
        case.name: Subject(models[cfg, case.name], case_module(case, cfg, params))
        for case in GENERATION_CASES
    }
    row = Result.about("", "generation", input_set="test_data_set_0")
    try:
        with ExitStack() as stack:
            opened = {
                name: stack.enter_context(open_subject(runtime, subject))
                for name, subject in subjects.items()
            }
            return _decode_all(runtime, cfg, opened, row, cases, progress)
    except NotRun as why:
        return [
            not_run(replace(row, case=c.name, input_set="*"), runtime, subjects[STEP.name], why)
            for c in cases
        ]


def _decode_all(runtime, cfg, opened, row: Result, cases, progress) -> list[Result]:
    tol = step_tolerance(opened[STEP.name].precision)
    results = []
    for case in cases:
        progress(f"  {label(runtime)}: {case.name}")
        inputs = case.input_set.inputs
        for cache in (True, False):
            decoder = STEP if cache else PREFIX
            stepper = make_stepper(opened, cfg, cache)
            try:
                with np.errstate(invalid="ignore"):  # -inf fill sets hold NaN rows by design
                    actual = generate(
                        stepper, inputs["src_ids"], inputs["src_keep"], case.decoding,
                        case.strategy, (inputs["prefix_ids"], inputs["prefix_keep"]),
                    )  # fmt: skip
            except DegenerateOutput as exc:  # no distribution to decode from: a failure
                verdict = Verdict(Status.FAIL, [], None, str(exc))
            except TconformError:  # a usage error (feeds the session refuses) stays one
                raise
            except WorkerCrashed as exc:  # the runtime's worker died mid-decoding: its verdict
                verdict = Verdict(Status.CRASH, [], None, str(exc))
            except Exception as exc:  # the runtime broke mid-decoding, on valid input
                verdict = Verdict(Status.ERROR, [], None, first_line(exc))
            else:
                verdict = judge(case.generation(), actual, tol)
            what = "with the key/value cache" if cache else "without a cache (whole prefix)"
            result = opened[decoder.name].stamp(
                replace(
                    row,
                    case=case.name,
                    component=f"generation, {case.strategy.name}, {what}",
                    cell="kv-cache" if cache else "no-cache",
                    notes=[f"decoder: {decoder.name}; mask fill {cfg.mask_fill}"],
                )
            )
            result.status, result.message = str(verdict.status), verdict.message
            result.outputs = [verdict.log_probs] if verdict.log_probs else []
            results.append(result)
    return results
