"""torch -> ONNX: one model per case, cached by what determines its bytes, with a manifest.

`DIR/<case>/model.onnx` uses the same case names as golden/, so a model and its goldens form one
standard ONNX test case. `DIR/manifest.json` records per model the component, config, seed,
exporter, opset, IR version, inputs/outputs with dynamic axes, sha256 and the cache key.

The cache only ever replaces its own, unchanged files. A model is re-exported when its key
(config, seed, case, exporter, opset, dtype, library versions, and the source of the code that
defines the model) changes, but only if the manifest records the file and the file's sha256
still equals the recorded one. A file with no manifest entry, in a folder with no manifest, or
changed since tconform wrote it is somebody else's model: it is never replaced, only refused
(`--model CASE=PATH` verifies it as it is; `tconform export --force` replaces it). A folder holds
models of one exporter, opset and dtype, so that nothing switches a folder's precision silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import multiprocessing
import os
import tempfile
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch

from tconform import registry
from tconform.config import ModelConfig
from tconform.errors import UsageError
from tconform.files import atomic_write_bytes, atomic_write_json, sha256_file
from tconform.folders import ARTIFACTS, MANIFEST, read_json_manifest, require_artifacts_folder
from tconform.provenance import ModelProvenance
from tconform.registry import Case, Shape
from tconform.schema import check_artifacts_manifest
from tconform.versions import library_versions
from tconform.weights import DEFAULT_SEED, load_params, make_params

EXPORTERS = ("dynamo", "torchscript")
DTYPES = {"float32": torch.float32, "float16": torch.float16}
DEFAULT_OPSET = 18
MAX_IR_VERSION = 10  # ONNX Runtime 1.30/1.31 refuse IR > 13; the exporters write <= 10

# The source files whose text decides what a case exports.
_PACKAGE = Path(__file__).parent
_MODEL_SOURCES = sorted(
    [
        *(_PACKAGE / "reference").glob("*.py"),
        _PACKAGE / "registry.py",
        _PACKAGE / "weights.py",
        _PACKAGE / "config.py",
        Path(__file__),
    ]
)


@dataclass(frozen=True)
class ExportSettings:
    cfg: ModelConfig
    seed: int = DEFAULT_SEED
    exporter: str = "dynamo"
    opset: int = DEFAULT_OPSET
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.exporter not in EXPORTERS:
            raise UsageError(
                f"unknown exporter {self.exporter!r}; choose from {', '.join(EXPORTERS)}"
            )
        if self.dtype not in DTYPES:
            raise UsageError(f"unknown dtype {self.dtype!r}; choose from {', '.join(DTYPES)}")
        top = 20 if self.exporter == "torchscript" else 23
        if not 17 <= self.opset <= top:
            raise UsageError(f"opset {self.opset} out of range for {self.exporter}: 17..{top}")


def _source_digest() -> str:
    h = hashlib.sha256()
    for path in _MODEL_SOURCES:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def cache_key(case: Case, settings: ExportSettings) -> str:
    blob = json.dumps(
        {
            "case": case.name,
            "config": settings.cfg.to_dict(),
            "seed": settings.seed,
            "exporter": settings.exporter,
            "opset": settings.opset,
            "dtype": settings.dtype,
            "versions": {k: v for k, v in library_versions().items() if k != "python"},
            "source": _source_digest(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def example_shape(cfg: ModelConfig) -> Shape:
    # Distinct sizes per axis, none of them 0 or 1, so the exporter cannot specialise an axis
    # or assume that source and target lengths are equal.
    return Shape(2, min(7, cfg.max_seq_len), min(5, cfg.max_seq_len - 1))


def build_module(case: Case, settings: ExportSettings) -> tuple[torch.nn.Module, dict]:
    module = case.build(settings.cfg)
    params = make_params(module, settings.seed)
    return load_params(module.to(DTYPES[settings.dtype]), params), params


def _example_args(case: Case, settings: ExportSettings) -> tuple[torch.Tensor, ...]:
    rng = np.random.default_rng(0)
    arrays = registry.make_inputs(case, settings.cfg, example_shape(settings.cfg), rng)
    args = []
    for spec in case.inputs(settings.cfg):
        t = torch.from_numpy(arrays[spec.name])
        args.append(t.to(DTYPES[settings.dtype]) if spec.kind == "float" else t)
    return tuple(args)


def dynamic_axes(case: Case, cfg: ModelConfig) -> dict[str, dict[int, str]]:
    """{tensor name: {axis index: axis name}} for every dynamic axis of inputs and outputs."""
    specs = (*case.inputs(cfg), *case.outputs(cfg))
    return {
        s.name: {i: a for i, a in enumerate(s.axes) if a in registry.DYNAMIC_AXES} for s in specs
    }


@contextlib.contextmanager
def _quiet():
    """The exporters print progress and warnings of their own; tconform reports instead."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _export_to(case: Case, settings: ExportSettings, path: Path) -> None:
    module, _ = build_module(case, settings)
    args = _example_args(case, settings)
    inputs = [s.name for s in case.inputs(settings.cfg)]
    outputs = [s.name for s in case.outputs(settings.cfg)]
    axes = dynamic_axes(case, settings.cfg)
    with _quiet():
        if settings.exporter == "dynamo":
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=True,
                input_names=inputs,
                output_names=outputs,
                dynamic_shapes=tuple(axes[n] for n in inputs),  # positional: forward's names vary
                opset_version=settings.opset,
                external_data=False,
                verbose=False,
            )
        else:
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=False,
                input_names=inputs,
                output_names=outputs,
                dynamic_axes={n: a for n, a in axes.items() if a},
                opset_version=settings.opset,
            )


def _summary(exc: Exception) -> str:
    """The line of an exporter error that says what went wrong (dynamo leads with a banner)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("<class"):
            return ln
    return lines[0] if lines else type(exc).__name__


def _finish(raw: Path) -> onnx.ModelProto:
    """Check the exported model and fix what ONNX Runtime needs (the IR version)."""
    model = onnx.load(str(raw))
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    try:  # the model must also load where it will run
        onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise UsageError(f"exported model does not load in ONNX Runtime: {_summary(exc)}") from None
    return model


@dataclass
class ExportRecord:
    case: str
    component: str
    path: str
    cached: bool
    key: str
    sha256: str
    exporter: str
    opset: int
    ir_version: int
    dtype: str
    inputs: list[str]
    outputs: list[str]
    dynamic_axes: dict[str, dict[int, str]]
    producer: str = ""
    opsets: dict[str, int] = field(default_factory=dict)
    folder: str = ""  # the artifacts folder it lives in (not part of the manifest entry)

    @property
    def location(self) -> str:
        return str(Path(self.folder) / self.path)

    def to_manifest(self) -> dict[str, object]:
        entry = asdict(self)
        entry.pop("cached")
        entry.pop("folder")
        return entry

    def provenance(self) -> ModelProvenance:
        """The model as a result names it: path, sha256, and whether this run wrote it."""
        return ModelProvenance(
            path=self.location,
            sha256=self.sha256,
            origin="cached" if self.cached else "exported",
            producer=self.producer,
            opsets=dict(self.opsets),
            ir_version=self.ir_version,
            elem_type=self.dtype,
        )

    @classmethod
    def from_manifest(cls, entry: dict, folder: Path) -> ExportRecord:
        known = {f.name for f in fields(cls)} - {"cached", "folder"}
        return cls(
            **{k: v for k, v in entry.items() if k in known}, cached=True, folder=str(folder)
        )


def read_manifest(out_dir: Path) -> dict:
    """The artifacts folder's manifest ({} for a new folder); a golden folder is refused."""
    require_artifacts_folder(out_dir)
    path = out_dir / MANIFEST
    if not path.exists():
        return {}
    data = read_json_manifest(path)
    check_artifacts_manifest(data, path)
    return data


def _is_current(path: Path, key: str, previous: dict | None, force: bool) -> bool:
    """Whether the model at `path` can be reused as it is (False: export it).

    Only tconform's own unchanged file may be replaced: a file that exists with no manifest
    entry, or whose bytes differ from the recorded sha256, is refused unless `force`."""
    if not path.exists():
        return False
    if not path.is_file():
        raise UsageError(f"{path}: exists and is not a regular file; tconform will not replace it")
    ways_on = (
        f"verify it as it is with --model {path.parent.name}={path}, "
        "or replace it with `tconform export --force`"
    )
    if previous is None:
        if force:
            return False
        raise UsageError(f"{path}: not written by tconform (no entry in {MANIFEST}); {ways_on}")
    if sha256_file(path) != previous.get("sha256"):
        if force:
            return False
        raise UsageError(f"{path}: changed since tconform wrote it (sha256 differs); {ways_on}")
    return previous.get("key") == key


def export_case(case: Case, settings: ExportSettings, out_dir: Path) -> ExportRecord:
    """Export one case to out_dir/<case>/model.onnx (atomically) and describe it."""
    path = out_dir / case.name / "model.onnx"
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "model.onnx"
        try:
            _export_to(case, settings, raw)
        except Exception as exc:
            raise UsageError(
                f"export of {case.name} with {settings.exporter} failed: {_summary(exc)}"
            ) from None
        model = _finish(raw)
    atomic_write_bytes(path, model.SerializeToString())
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    return ExportRecord(
        case=case.name,
        component=case.component,
        path=str(path.relative_to(out_dir)),
        cached=False,
        key=cache_key(case, settings),
        sha256=sha256_file(path),
        exporter=settings.exporter,
        opset=max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        ir_version=model.ir_version,
        dtype=settings.dtype,
        inputs=[s.name for s in case.inputs(settings.cfg)],
        outputs=[s.name for s in case.outputs(settings.cfg)],
        dynamic_axes=dynamic_axes(case, settings.cfg),
        producer=producer,
        opsets={o.domain or "ai.onnx": o.version for o in model.opset_import},
        folder=str(out_dir),
    )


def _export_by_name(name: str, settings: ExportSettings, out_dir: Path) -> ExportRecord:
    return export_case(registry.get_case(name), settings, out_dir)


@dataclass(frozen=True)
class ExportJob:
    """One model to have current: `case` at `settings` in `out_dir`/<case>/model.onnx."""

    case: Case
    settings: ExportSettings
    out_dir: Path


# What a folder's models have in common; a folder never mixes them.
FOLDER_SETTINGS = ("exporter", "opset", "dtype")


def folder_settings(out_dir: Path) -> dict[str, object] | None:
    """The exporter, opset and dtype of the models an artifacts folder holds (None: a new or
    empty folder, whose settings the first export decides)."""
    manifest = read_manifest(out_dir)
    if not manifest.get("models"):
        return None
    # Manifests written before "opset" was recorded at the top: every model says its own.
    first = next(iter(manifest["models"].values()))
    found = {
        k: manifest.get(k, first.get(k) if isinstance(first, dict) else None)
        for k in FOLDER_SETTINGS
    }
    return found


class _Folder:
    """One artifacts folder and its manifest, rewritten after every model so that an
    interrupted run keeps what it finished."""

    def __init__(self, out_dir: Path, settings: ExportSettings) -> None:
        self.out_dir = out_dir
        self.settings = settings
        self.models: dict = dict(read_manifest(out_dir).get("models", {}))
        held = folder_settings(out_dir)
        wanted = {k: getattr(settings, k) for k in FOLDER_SETTINGS}
        if held is not None and held != wanted:
            raise UsageError(
                f"{out_dir} holds {_describe(held)} models; export {_describe(wanted)} into a "
                "folder of its own (--out DIR)"
            )

    def add(self, record: ExportRecord) -> None:
        self.models[record.case] = record.to_manifest()
        atomic_write_json(
            self.out_dir / MANIFEST,
            {
                "kind": ARTIFACTS,
                "tool": "tconform",
                "config": self.settings.cfg.to_dict(),
                "seed": self.settings.seed,
                "exporter": self.settings.exporter,
                "opset": self.settings.opset,
                "dtype": self.settings.dtype,
                "versions": library_versions(),
                "models": self.models,
            },
        )


def _describe(settings: dict[str, object]) -> str:
    return f"{settings['exporter']} opset {settings['opset']} {settings['dtype']}"


# Biggest graphs first (by the case's size class), so that the longest export never starts last.
_SIZE_ORDER = ("model", "stack", "layer", "component")


def _copy_model(record: ExportRecord, source_dir: Path, job: ExportJob) -> ExportRecord:
    """An identical model (same cache key) already exported elsewhere, copied into place: a
    file written by this run, so not `cached`."""
    target = job.out_dir / job.case.name / "model.onnx"
    atomic_write_bytes(target, (source_dir / record.path).read_bytes())
    path = str(target.relative_to(job.out_dir))
    return replace(record, path=path, cached=False, folder=str(job.out_dir))


def export_jobs(
    jobs: Iterable[ExportJob],
    on_done: Callable[[ExportRecord], None] | None = None,
    force: bool = False,
    workers: int | None = None,
) -> list[ExportRecord]:
    """Make every job's model current and keep each folder's manifest current.

    A model whose cache key and bytes match its manifest is reused; one whose key matches a
    model current in another folder is copied; the rest are exported, each distinct key once,
    in `workers` processes (default: one per core, at most two: each export is
    single-threaded Python tracing). `on_done` reports every record as it is settled. A file
    that tconform did not write, or that changed since, is refused unless `force`.
    """
    jobs = list(jobs)
    folders: dict[Path, _Folder] = {}
    for job in jobs:
        folders.setdefault(job.out_dir, _Folder(job.out_dir, job.settings))
    records: dict[int, ExportRecord] = {}
    current: dict[str, tuple[ExportRecord, Path]] = {}  # key -> a current model and its folder
    todo: dict[str, list[int]] = {}  # key -> indices of the jobs that need that model
    for n, job in enumerate(jobs):
        key = cache_key(job.case, job.settings)
        previous = folders[job.out_dir].models.get(job.case.name)
        path = job.out_dir / job.case.name / "model.onnx"
        if _is_current(path, key, previous, force):
            records[n] = ExportRecord.from_manifest(previous, job.out_dir)
            current.setdefault(key, (records[n], job.out_dir))
            if on_done:
                on_done(records[n])
        else:
            todo.setdefault(key, []).append(n)

    def settle(key: str, record: ExportRecord, source_dir: Path) -> None:
        for n in todo[key]:
            job = jobs[n]
            if job.out_dir != source_dir:
                records[n] = _copy_model(record, source_dir, job)
            else:
                records[n] = record
            folders[job.out_dir].add(records[n])
            if on_done:
                on_done(records[n])

    to_export = []
    for key in todo:
        if key in current:
            settle(key, *current[key])
        else:
            to_export.append(key)
    to_export.sort(key=lambda k: _SIZE_ORDER.index(jobs[todo[k][0]].case.tolerance))

    def first(key: str) -> ExportJob:
        return jobs[todo[key][0]]

    count = min(workers or min(2, os.cpu_count() or 1), len(to_export))
    if count <= 1:
        for key in to_export:
            job = first(key)
            settle(key, export_case(job.case, job.settings, job.out_dir), job.out_dir)
    else:
        context = multiprocessing.get_context("spawn")  # fork after torch starts threads can hang
        with ProcessPoolExecutor(count, mp_context=context) as pool:
            futures = {
                pool.submit(
                    _export_by_name, first(k).case.name, first(k).settings, first(k).out_dir
                ): k
                for k in to_export
            }
            for future in as_completed(futures):
                key = futures[future]
                settle(key, future.result(), first(key).out_dir)
    return [records[n] for n in range(len(jobs))]


def export_cases(
    cases: Iterable[Case],
    settings: ExportSettings,
    out_dir: Path,
    on_done: Callable[[ExportRecord], None] | None = None,
    force: bool = False,
    jobs: int | None = None,
) -> list[ExportRecord]:
    """Export (or reuse) every case at one setting into one folder (see export_jobs)."""
    return export_jobs(
        (ExportJob(case, settings, out_dir) for case in cases), on_done, force, workers=jobs
    )
