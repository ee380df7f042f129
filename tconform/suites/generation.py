"""tconform's generation goldens as a suite (`tconform verify --generation`): each golden
sequence decoded on every runtime by the three generation models, with the key/value cache and
without it (its two input sets, `kv-cache` and `no-cache`), and judged token for token
(tconform.generation.verdict).

The models are exported (or reused) into <artifacts>/generation, and for the sets whose mask
fill differs from the preset's into <artifacts>/generation-fill<fill>: the fill is part of the
model. `--no-export` takes those folders as they are; `--model gen_step=PATH` (or gen_encoder,
gen_prefix) runs a given file, read-only, on the goldens of the preset's own mask fill (a model
holds one fill; the lanes of those goldens are the `given` cell). Every result names the decoder
model that ran (path, sha256, origin).

The goldens are decoded with the weights of a trained checkpoint (recorded in their manifest,
tconform.generation.golden); the exports hold the same weights (ExportSettings.checkpoint, part
of the cache key), and PyTorch runs the modules with them. A runtime's three sessions of one
mask fill are opened once and serve every golden of that fill; a crash closes them, and the next
decoding opens them again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tconform.config import ModelConfig
from tconform.errors import TconformError, UsageError, WorkerCrashed, first_line
from tconform.execution import (
    NotRun,
    Opened,
    Subject,
    case_module,
    crash_message,
    not_run,
    open_subject,
    require_placement,
)
from tconform.export import (
    ExportJob,
    ExportRecord,
    ExportSettings,
    cache_key,
    export_jobs,
    read_artifacts_manifest,
    require_new_or_artifacts,
)
from tconform.files import sha256_file
from tconform.folders import GENERATION_AREA, MANIFEST, folder_lock
from tconform.generation import golden
from tconform.generation.driver import DegenerateOutput, generate
from tconform.generation.steppers import make_stepper
from tconform.generation.verdict import Verdict, judge, step_tolerance
from tconform.models import ModelUnderTest, given_model, held_model, model_from_record
from tconform.plan import Lane, Progress, Suite
from tconform.registry import ENCODER, GENERATION_CASES, PREFIX, STEP, generation_case
from tconform.request import Axes, Generations, Request
from tconform.results import Result, Status
from tconform.runtimes import Runtime, label
from tconform.units import Cell


@dataclass(frozen=True)
class Decoding:
    """An input set of a generation golden: decoded with the key/value cache or without it."""

    name: str
    cache: bool

    @property
    def decoder(self) -> str:
        return STEP.name if self.cache else PREFIX.name

    @property
    def what(self) -> str:
        return "with the key/value cache" if self.cache else "without a cache (whole prefix)"


DECODINGS = (Decoding("kv-cache", True), Decoding("no-cache", False))


def model_folder(artifacts_dir: Path, cfg: ModelConfig, preset_cfg: ModelConfig) -> Path:
    if cfg.mask_fill == preset_cfg.mask_fill:
        return artifacts_dir / GENERATION_AREA
    return artifacts_dir / f"{GENERATION_AREA}-fill{cfg.mask_fill}"


def export_settings(cfg: ModelConfig, seed: int, checkpoint: str) -> ExportSettings:
    """The generation models' export: float32, with the checkpoint's weights."""
    return ExportSettings(cfg, seed, checkpoint=checkpoint)


def export_models(
    configs: list[ModelConfig],
    preset_cfg: ModelConfig,
    seed: int,
    artifacts_dir: Path,
    progress: Progress,
    checkpoint: str = golden.CHECKPOINT,
    given: Collection[tuple[ModelConfig, str]] = (),
) -> dict[tuple[ModelConfig, str], ExportRecord]:
    """Every generation model of every config but those `given`, exported where not current,
    in one pool."""
    jobs = [
        ExportJob(
            case,
            export_settings(cfg, seed, checkpoint),
            model_folder(artifacts_dir, cfg, preset_cfg),
        )
        for cfg in configs
        for case in GENERATION_CASES
        if (cfg, case.name) not in given
    ]
    records = export_jobs(
        jobs, on_done=lambda r: progress(f"  {r.location}: {'reused' if r.cached else 'exported'}")
    )
    return {(job.settings.cfg, job.case.name): r for job, r in zip(jobs, records, strict=True)}


class GenerationSuite(Suite):
    """The generation goldens of `request`'s Generations. Open it with `generation_suite`,
    which holds the golden folder's lock and closes the sessions."""

    def __init__(self, request: Request, stack: ExitStack) -> None:
        subject = request.subject
        assert isinstance(subject, Generations)
        if request.localise.when != "never":
            raise UsageError(
                "--localise localises a component's model; --generation judges decoded tokens"
            )
        self.request, self.subject, self.stack = request, subject, stack
        folder = subject.golden_dir
        self.where = str(folder / MANIFEST)
        self.preset_cfg, self.seed, self.recorded, cases = golden.read_cases(folder)
        self.checkpoint = golden.require_current_checkpoint(folder, self.recorded)
        self.cases = _named(cases, subject.cases, folder)
        if subject.export:  # its models go to DIR/generation: DIR is held to the folder's rule
            require_new_or_artifacts(subject.artifacts_dir)
        self.decoders: dict[tuple[ModelConfig, str], ModelUnderTest] = {}
        self.opened: dict[tuple[str, ModelConfig], tuple[ExitStack, dict[str, Opened]]] = {}
        self.not_opened: dict[tuple[str, ModelConfig], NotRun] = {}

    def config(self, case: golden.GenerationCase) -> ModelConfig:
        """The config the case decodes with: the preset's, at its set's mask fill."""
        return golden.set_config(self.preset_cfg, case.source_set)

    # --- planning ---------------------------------------------------------------------------

    def cells(self, axes: Axes) -> list[Cell]:
        if axes.matrix:
            raise UsageError("--generation has no matrix: its models are float32 exports")
        settings = export_settings(self.preset_cfg, self.seed, self.checkpoint)
        return [Cell(settings.exporter, settings.opset, settings.dtype, axes.graph_opts[0])]

    def given(self, case: golden.GenerationCase) -> bool:
        return bool(self.subject.models) and self.config(case) == self.preset_cfg

    def set_names(self, case: golden.GenerationCase) -> list[str]:
        return [d.name for d in DECODINGS]

    def models(
        self, lanes: list[Lane], mine: set[str], progress: Progress
    ) -> dict[tuple[str, str], ModelUnderTest]:
        """The step model of every ONNX lane (the results name it); the three decoders of each
        mask fill the lanes need are held for `run`."""
        onnx = [lane for lane in lanes if lane.runtime.consumes == "onnx"]
        configs = list(dict.fromkeys(self.config(lane.case) for lane in lanes))
        progress(
            f"generation models for {len(configs)} mask fill(s) in {self.subject.artifacts_dir}"
        )
        self.decoders = self._decoders(configs, progress) if onnx else {}
        return {lane.model_key: self.decoders[self.config(lane.case), STEP.name] for lane in onnx}

    def _decoders(
        self, configs: list[ModelConfig], progress: Progress
    ) -> dict[tuple[ModelConfig, str], ModelUnderTest]:
        """The file each generation model of each config runs: a given one (checked before any
        export), the artifacts folder's as it is (--no-export), or tconform's export."""
        subject, preset_cfg = self.subject, self.preset_cfg
        chosen = {
            (preset_cfg, name): given_model(generation_case(name), preset_cfg, path)
            for name, path in subject.models.items()
        }
        for (_, name), model in chosen.items():
            if model.precision != "float32":  # the steppers hold a float32 cache
                raise UsageError(
                    f"{model.path}: a {model.precision} model; generation checks float32"
                )
            progress(
                f"  {name}: the given model {model.path} (sha256 "
                f"{model.provenance.sha256[:12]}), on the goldens of mask fill "
                f"{preset_cfg.mask_fill} (a model holds one fill)"
            )
        if not subject.export:
            for cfg in configs:
                folder = model_folder(subject.artifacts_dir, cfg, preset_cfg)
                manifest = read_artifacts_manifest(folder)
                for case in GENERATION_CASES:
                    if (cfg, case.name) not in chosen:
                        key = cache_key(case, export_settings(cfg, self.seed, self.checkpoint))
                        chosen[cfg, case.name] = held_model(case, cfg, folder, manifest, key)
            return chosen
        folder = subject.artifacts_dir
        records = export_models(
            configs, preset_cfg, self.seed, folder, progress, self.checkpoint, given=set(chosen)
        )
        for (cfg, name), record in records.items():
            chosen[cfg, name] = model_from_record(generation_case(name), record)
        return chosen

    # --- running ----------------------------------------------------------------------------

    def input_sets(self, case: golden.GenerationCase) -> list[Decoding]:
        return list(DECODINGS)

    def run(
        self, lane: Lane, models: dict, sets: list[Decoding], strict_placement: bool
    ) -> list[Result]:
        """The golden decoded on the lane's runtime in each of `sets`, judged token for token."""
        case, runtime = lane.case, lane.runtime
        cfg = self.config(case)
        results = []
        for decoding in sets:
            component = f"{case.component}, mask fill {cfg.mask_fill}, {decoding.what}"
            row = Result.about(case.name, component, input_set=decoding.name)
            try:
                opened = self._sessions(runtime, cfg)
            except NotRun as why:
                subject = Subject(self.decoders.get((cfg, STEP.name)))
                results.append(not_run(row, runtime, subject, why))
                continue
            results.append(self._decode(opened, cfg, case, decoding, row))
            results[-1].notes += self._encoder_notes(runtime, cfg)
            if results[-1].status == Status.CRASH:  # the worker is gone: open anew next time
                self.opened.pop((label(runtime), cfg))[0].close()
        if strict_placement:
            require_placement(results)
        return results

    def _encoder_notes(self, runtime: Runtime, cfg: ModelConfig) -> list[str]:
        """A row names the decoder that ran; the encoder is named beside it where it is not
        tconform's own unchanged export (a given file, or one changed since)."""
        encoder = self.decoders.get((cfg, ENCODER.name))
        if runtime.consumes != "onnx" or encoder is None or encoder.provenance.origin != "given":
            return []
        return [f"{ENCODER.name}: {encoder.provenance.short}", *encoder.notes]

    def _sessions(self, runtime: Runtime, cfg: ModelConfig) -> dict[str, Opened]:
        """The runtime's three sessions of `cfg`'s models, opened on first use; NotRun (kept, so
        it is not tried again) where they cannot be."""
        key = (label(runtime), cfg)
        if key in self.not_opened:
            raise self.not_opened[key]
        if key not in self.opened:
            params = golden.golden_params(cfg, self.checkpoint)
            stack = self.stack.enter_context(ExitStack())
            try:
                opened = {
                    case.name: stack.enter_context(
                        open_subject(
                            runtime,
                            Subject(
                                self.decoders.get((cfg, case.name)),
                                case_module(case, cfg, params),
                            ),
                        )
                    )
                    for case in GENERATION_CASES
                }
            except NotRun as why:
                stack.close()
                self.not_opened[key] = why
                raise
            self.opened[key] = (stack, opened)
        return self.opened[key][1]

    def _decode(
        self,
        opened: dict[str, Opened],
        cfg: ModelConfig,
        case: golden.GenerationCase,
        decoding: Decoding,
        row: Result,
    ) -> Result:
        inputs = case.input_set.inputs
        stepper = make_stepper(opened, cfg, decoding.cache)
        try:
            with np.errstate(invalid="ignore"):  # -inf fill sets hold NaN rows by design
                actual = generate(
                    stepper, inputs["src_ids"], inputs["src_keep"], case.decoding, case.strategy,
                    (inputs["prefix_ids"], inputs["prefix_keep"]),
                )  # fmt: skip
        except DegenerateOutput as exc:  # no distribution to decode from: a failure
            verdict = Verdict(Status.FAIL, [], None, str(exc))
        except TconformError:  # a usage error (feeds the session refuses) stays one
            raise
        except WorkerCrashed as exc:  # the runtime's worker died mid-decoding: its verdict
            verdict = Verdict(Status.CRASH, [], None, _crash_message(opened, exc))
        except Exception as exc:  # the runtime broke mid-decoding, on valid input
            verdict = Verdict(Status.ERROR, [], None, first_line(exc))
        else:
            tol = step_tolerance(opened[STEP.name].precision)
            verdict = judge(case.generation(), actual, tol)
        result = opened[decoding.decoder].stamp(row)
        result.status, result.message = str(verdict.status), verdict.message
        result.outputs = [verdict.log_probs] if verdict.log_probs else []
        return result

    def settings(self) -> dict[str, object]:
        folder = self.subject.golden_dir
        return {
            "golden_generation": str(folder),
            "golden_manifest_sha256": sha256_file(folder / MANIFEST),
            "artifacts": str(self.subject.artifacts_dir),
            "export": self.subject.export,
            "given_models": {name: str(path) for name, path in self.subject.models.items()},
            # every file the decoding ran (rows name their decoder), by model and mask fill
            "models": {
                f"{name} (mask fill {cfg.mask_fill})": model.provenance.to_dict()
                for (cfg, name), model in self.decoders.items()
            },
            "config": self.preset_cfg.to_dict(),
            "seed": self.seed,
            "checkpoint": self.recorded,
            "cases": [case.name for case in self.cases],
        }


def _crash_message(opened: dict[str, Opened], exc: WorkerCrashed) -> str:
    """A crash mid-decoding in one line, naming the repro bundle of the model whose run it was
    (the step model where the worker does not say) and that run's feeds where it had them all
    (a cached step's cache stays in the worker: the bundle then holds the model alone)."""
    crashed = next(
        (
            o
            for o in opened.values()
            if o.onnx_file and o.subject.onnx.path.absolute() == exc.model_path
        ),
        opened[STEP.name],
    )
    return crash_message(crashed.runtime, crashed.subject, exc.feeds, exc)


def _named(
    cases: list[golden.GenerationCase], names: tuple[str, ...], folder: Path
) -> tuple[golden.GenerationCase, ...]:
    """The goldens named (all where none is), in the folder's order. A plain run checks every
    golden tconform writes, so a folder missing one is an error, not a smaller pass."""
    known = [case.name for case in cases]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise UsageError(
            f"{folder}: no generation golden {unknown[0]!r}; choose from {', '.join(known)}"
        )
    missing = [name for name in golden.named_cases() if name not in known]
    if missing and not names:
        raise UsageError(
            f"{folder}: no generation golden {missing[0]!r} (a plain verify --generation checks "
            "every one; name the ones this folder holds with --case)"
        )
    return tuple(case for case in cases if not names or case.name in names)


@contextlib.contextmanager
def generation_suite(request: Request) -> Iterator[GenerationSuite]:
    """The suite of `request`'s Generations, its golden folder read under a shared lock and
    its sessions open for the block."""
    with ExitStack() as stack:
        stack.enter_context(folder_lock(request.subject.golden_dir, shared=True))
        yield GenerationSuite(request, stack)
