"""torch -> ONNX: one model per case, cached by what determines its bytes, with a manifest.

`DIR/<case>/model.onnx` uses the same case names as golden/, so a model and its goldens form one
standard ONNX test case. `DIR/manifest.json` records per model the component, config, seed,
exporter, opset, attention kernel, IR version, inputs/outputs with dynamic axes, sha256 and the
cache key.

The cache only ever replaces its own, unchanged files. A model is re-exported when its key
(config, seed, case, exporter, opset, dtype, attention kernel, library versions, and the source
of the code that defines the model) changes, but only if the manifest records the file and the
file's sha256 still equals the recorded one. A file with no manifest entry, in a folder with no
manifest, or changed since tconform wrote it is somebody else's model: it is never replaced,
only refused (`--model CASE=PATH` verifies it as it is; `tconform export --force` replaces it).
A folder holds models of one exporter, opset, dtype and attention kernel, so that nothing
switches a folder's precision or graph silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch

from tconform import registry
from tconform.config import ATTENTION_KERNELS, ModelConfig
from tconform.errors import UsageError
from tconform.files import atomic_write_bytes, atomic_write_json, require_inside, sha256_file
from tconform.folders import (
    ARTIFACTS,
    MANIFEST,
    folder_lock,
    read_json_manifest,
    require_artifacts_folder,
)
from tconform.provenance import ModelProvenance
from tconform.reference.attention import use_attention_kernel
from tconform.registry import Case, Shape
from tconform.schema import (
    SHA256,
    expect_int,
    expect_names,
    expect_object,
    expect_str,
    fail,
    one_of,
)
from tconform.versions import library_versions
from tconform.weights import DEFAULT_SEED, load_params, make_params

EXPORTERS = ("dynamo", "torchscript")
MAX_OPSET = {"dynamo": 23, "torchscript": 20}  # the TorchScript exporter stops at opset 20
OPSETS = tuple(range(17, max(MAX_OPSET.values()) + 1))
DTYPES = {"float32": torch.float32, "float16": torch.float16}
DEFAULT_OPSET = 18
# ONNX's Attention op, which the "sdpa" kernel exports to, exists from opset 23 on; below it
# the exporter spells the fused call out as MatMul, Softmax, Where, ... again.
ATTENTION_OPSET = 23


def default_opset(attention: str) -> int:
    return ATTENTION_OPSET if attention == "sdpa" else DEFAULT_OPSET


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
    attention: str = "plain"  # one of ATTENTION_KERNELS (reference/attention.py)

    def __post_init__(self) -> None:
        if self.exporter not in EXPORTERS:
            raise UsageError(
                f"unknown exporter {self.exporter!r}; choose from {', '.join(EXPORTERS)}"
            )
        if self.dtype not in DTYPES:
            raise UsageError(f"unknown dtype {self.dtype!r}; choose from {', '.join(DTYPES)}")
        if self.attention not in ATTENTION_KERNELS:
            raise UsageError(
                f"unknown attention kernel {self.attention!r}; "
                f"choose from {', '.join(ATTENTION_KERNELS)}"
            )
        if self.attention == "sdpa" and self.exporter != "dynamo":
            raise UsageError("--attention sdpa needs the dynamo exporter (ONNX Attention op)")
        top = MAX_OPSET[self.exporter]
        if not OPSETS[0] <= self.opset <= top:
            raise UsageError(
                f"opset {self.opset} out of range for {self.exporter}: {OPSETS[0]}..{top}"
            )


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
            "attention": settings.attention,
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
    module = use_attention_kernel(case.build(settings.cfg), settings.attention)
    params = make_params(module, settings.seed, case.weight_init)
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
        export_with_torch(
            module,
            args,
            path,
            settings.exporter,
            settings.opset,
            outputs,
            input_names=inputs,
            dynamic_shapes=tuple(axes[n] for n in inputs),  # positional: forward's names vary
            dynamic_axes={n: a for n, a in axes.items() if a},
        )


def export_with_torch(
    module: torch.nn.Module,
    args: tuple,
    path: Path,
    exporter: str,
    opset: int,
    output_names: list[str],
    *,
    input_names: list[str] | None = None,
    kwargs: dict | None = None,
    dynamic_shapes: tuple | dict | None = None,
    dynamic_axes: dict[str, dict[int, str]] | None = None,
) -> None:
    """torch.onnx.export as every tconform export calls it (the shipped cases and `tconform
    check`): the dynamo exporter takes `dynamic_shapes`, TorchScript `dynamic_axes`; weights
    stay inside the one file."""
    common = {
        "kwargs": kwargs,
        "input_names": input_names,
        "output_names": output_names,
        "opset_version": opset,
    }
    if exporter == "dynamo":
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            external_data=False,
            verbose=False,
            **common,
        )
    else:
        torch.onnx.export(
            module, args, str(path), dynamo=False, dynamic_axes=dynamic_axes, **common
        )


def exporter_error_line(exc: BaseException) -> str:
    """The line of an exporter error that says what went wrong (dynamo leads with a banner)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("<class"):
            return ln
    return lines[0] if lines else type(exc).__name__


# The dynamo exporter stores each node's Python stack trace, absolute paths of the exporting
# machine included; a model meant to be shipped should not carry them. The module scope
# (`namespace`), which localisation reads, is kept.
_STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"


def _drop_stack_traces(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        kept = [p for p in node.metadata_props if p.key != _STACK_TRACE_KEY]
        if len(kept) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(kept)


def checked_model(raw: Path) -> onnx.ModelProto:
    """Check the exported model and fix what ONNX Runtime needs (the IR version)."""
    model = onnx.load(str(raw))
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
    _drop_stack_traces(model)
    onnx.checker.check_model(model, full_check=True)
    try:  # the model must also load where it will run
        onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:
        reason = exporter_error_line(exc)
        raise UsageError(f"exported model does not load in ONNX Runtime: {reason}") from None
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
    attention: str = "plain"
    attention_nodes: int = 0  # ONNX Attention nodes in the graph (the fused kernel's)
    folder: str = ""  # the artifacts folder it lives in (not part of the manifest entry)
    staged: str = ""  # where a new export waits to be placed (not part of the manifest entry)

    @property
    def location(self) -> str:
        return str(Path(self.folder) / self.path)

    def to_manifest(self) -> dict[str, object]:
        entry = asdict(self)
        for transient in ("cached", "folder", "staged"):
            entry.pop(transient)
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
        known = {f.name for f in fields(cls)} - {"cached", "folder", "staged"}
        return cls(
            **{k: v for k, v in entry.items() if k in known}, cached=True, folder=str(folder)
        )


def read_manifest(out_dir: Path) -> dict:
    """The artifacts folder's manifest ({} for a new folder); a golden folder is refused."""
    require_artifacts_folder(out_dir)
    path = out_dir / MANIFEST
    if not path.exists():
        return {}
    data = read_json_manifest(require_inside(out_dir, path))
    check_artifacts_manifest(data, path)
    return data


def check_artifacts_manifest(data: dict, path: Path) -> None:
    """The artifacts manifest: per model its file (always CASE/model.onnx), sha256 and settings."""
    known = registry.exportable_names()
    models = expect_object(data.get("models", {}), path, "'models'")
    if "exporter" in data and not one_of(data["exporter"], EXPORTERS):
        raise fail(path, "'exporter'", f"is not one of {', '.join(EXPORTERS)}")
    if "dtype" in data and not one_of(data["dtype"], DTYPES):
        raise fail(path, "'dtype'", f"is not one of {', '.join(DTYPES)}")
    if "opset" in data:
        expect_int(data["opset"], path, "'opset'", 1, 100)
    if "attention" in data and not one_of(data["attention"], ATTENTION_KERNELS):
        raise fail(path, "'attention'", f"is not one of {', '.join(ATTENTION_KERNELS)}")
    for name, entry in models.items():
        where = f"model {name!r}"
        if name not in known:
            raise fail(path, where, "is not a case this tconform knows")
        entry = expect_object(entry, path, where)
        if entry.get("path") != f"{name}/model.onnx":
            raise fail(path, f"{where} 'path'", f"must be {name}/model.onnx")
        expect_str(entry.get("sha256"), path, f"{where} 'sha256'", SHA256)
        expect_str(entry.get("key"), path, f"{where} 'key'", SHA256)
        if not one_of(entry.get("exporter"), EXPORTERS) or not one_of(entry.get("dtype"), DTYPES):
            raise fail(path, where, "has an unknown exporter or dtype")
        expect_int(entry.get("opset"), path, f"{where} 'opset'", 1, 100)
        expect_int(entry.get("ir_version"), path, f"{where} 'ir_version'", 1, 100)
        expect_names(entry.get("inputs"), path, f"{where} 'inputs'")
        expect_names(entry.get("outputs"), path, f"{where} 'outputs'")


def _is_current(path: Path, key: str, previous: dict | None, force: bool, out_dir: Path) -> bool:
    """Whether the model at `path` can be reused as it is (False: export it).

    Only tconform's own unchanged file may be replaced: a file that exists with no manifest
    entry, or whose bytes differ from the recorded sha256, is refused unless `force`; one that
    is a symlink leading out of the folder is refused."""
    require_inside(out_dir, path)  # also when missing: its case folder may lead out
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
    sha = sha256_file(path)
    if sha == previous.get("sha256"):
        return previous.get("key") == key
    # Checked second: a re-export can write the very bytes it replaced (both sha256 equal).
    if sha == previous.get("previous_sha256"):
        return False  # tconform's own older file: a run stopped between recording and placing
    if force:
        return False
    raise UsageError(f"{path}: changed since tconform wrote it (sha256 differs); {ways_on}")


STAGING = ".tconform-staging"  # new models are written here, then renamed into place


def staging_dir(out_dir: Path) -> Path:
    return out_dir / STAGING


def export_case(case: Case, settings: ExportSettings, out_dir: Path) -> ExportRecord:
    """Export one case into out_dir's staging folder and describe it. Only the process that
    records it in the manifest renames it into place (see `_Folder.place`), so a killed run
    never leaves a model that the manifest does not know."""
    staged = Path(tempfile.mkdtemp(prefix=f"{case.name}.", dir=_made(staging_dir(out_dir))))
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "model.onnx"
        try:
            _export_to(case, settings, raw)
        except Exception as exc:
            raise UsageError(
                f"export of {case.name} with {settings.exporter} failed: {exporter_error_line(exc)}"
            ) from None
        model = checked_model(raw)
    atomic_write_bytes(staged / "model.onnx", model.SerializeToString())
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    return ExportRecord(
        case=case.name,
        component=case.component,
        path=f"{case.name}/model.onnx",
        cached=False,
        key=cache_key(case, settings),
        sha256=sha256_file(staged / "model.onnx"),
        exporter=settings.exporter,
        opset=max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        ir_version=model.ir_version,
        dtype=settings.dtype,
        inputs=[s.name for s in case.inputs(settings.cfg)],
        outputs=[s.name for s in case.outputs(settings.cfg)],
        dynamic_axes=dynamic_axes(case, settings.cfg),
        producer=producer,
        opsets={o.domain or "ai.onnx": o.version for o in model.opset_import},
        attention=settings.attention,
        attention_nodes=sum(node.op_type == "Attention" for node in model.graph.node),
        folder=str(out_dir),
        staged=str(staged / "model.onnx"),
    )


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _export_by_name(name: str, settings: ExportSettings, out_dir: Path) -> ExportRecord:
    """An export worker's job: cases do not pickle, so workers find them by name."""
    return export_case(registry.exportable_case(name), settings, out_dir)


@dataclass(frozen=True)
class ExportJob:
    """One model to have current: `case` at `settings` in `out_dir`/<case>/model.onnx."""

    case: Case
    settings: ExportSettings
    out_dir: Path


# What a folder's models have in common; a folder never mixes them.
FOLDER_SETTINGS = ("exporter", "opset", "dtype", "attention")


def folder_settings(out_dir: Path) -> dict[str, object] | None:
    """The exporter, opset, dtype and attention kernel of the models an artifacts folder holds
    (None: a new or empty folder, whose settings the first export decides)."""
    manifest = read_manifest(out_dir)
    if not manifest.get("models"):
        return None
    # Manifests written before "opset" was recorded at the top: every model says its own;
    # before "attention" was recorded, every model was plain.
    first = next(iter(manifest["models"].values()))
    found = {
        k: manifest.get(k, first.get(k) if isinstance(first, dict) else None)
        for k in FOLDER_SETTINGS
    }
    found["attention"] = found["attention"] or "plain"
    return found


class _Folder:
    """One artifacts folder, locked for the run, and its manifest, rewritten after every model
    so that an interrupted run keeps what it finished.

    A new model is placed in two steps: first its entry is recorded (with the sha256 of the
    file it replaces, if any), then the staged file is renamed into place. A run killed between
    the two leaves either the old file (recognised as tconform's own through that recorded
    sha256) or the new one, never a model the manifest does not know."""

    def __init__(self, out_dir: Path, settings: ExportSettings, stack: ExitStack) -> None:
        self.out_dir = out_dir
        self.settings = settings
        require_artifacts_folder(out_dir)
        stack.enter_context(folder_lock(_made(out_dir)))
        shutil.rmtree(staging_dir(out_dir), ignore_errors=True)  # an earlier run's leftovers
        self.models: dict = dict(read_manifest(out_dir).get("models", {}))
        held = folder_settings(out_dir)
        wanted = {k: getattr(settings, k) for k in FOLDER_SETTINGS}
        if held is not None and held != wanted:
            raise UsageError(
                f"{out_dir} holds {_describe(held)} models; export {_describe(wanted)} into a "
                "folder of its own (--out DIR)"
            )

    def place(self, record: ExportRecord, staged: Path) -> ExportRecord:
        """Record `record` and move its staged file into place."""
        target = require_inside(self.out_dir, self.out_dir / record.path)
        entry = record.to_manifest()
        if target.is_file():
            entry["previous_sha256"] = sha256_file(target)
        self.models[record.case] = entry
        self._write_manifest()
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, target)
        shutil.rmtree(staged.parent, ignore_errors=True)
        return replace(record, folder=str(self.out_dir), staged="")

    def _write_manifest(self) -> None:
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
                "attention": self.settings.attention,
                "versions": library_versions(),
                "models": self.models,
            },
        )

    def stage_copy(self, record: ExportRecord, source: Path) -> Path:
        """An identical model (same cache key) from another folder, staged here."""
        staged = Path(
            tempfile.mkdtemp(prefix=f"{record.case}.", dir=_made(staging_dir(self.out_dir)))
        )
        shutil.copyfile(source, staged / "model.onnx")
        return staged / "model.onnx"


def _describe(settings: dict[str, object]) -> str:
    kernel = "" if settings["attention"] == "plain" else f" {settings['attention']}-attention"
    return f"{settings['exporter']} opset {settings['opset']} {settings['dtype']}{kernel}"


# Biggest graphs first (by the case's size class), so that the longest export never starts last;
# a class not listed here goes last.
_SIZE_ORDER = ("model", "stack", "layer", "component")


def _size_rank(case: Case) -> int:
    return _SIZE_ORDER.index(case.tolerance) if case.tolerance in _SIZE_ORDER else len(_SIZE_ORDER)


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
    that tconform did not write, or that changed since, is refused unless `force`. Each folder
    is locked for the whole call, so concurrent runs on one folder wait for each other.
    """
    jobs = list(jobs)
    with ExitStack() as stack:
        folders: dict[Path, _Folder] = {}
        for out_dir in sorted({job.out_dir for job in jobs}):  # one order: no lock cycles
            settings = next(job.settings for job in jobs if job.out_dir == out_dir)
            folders[out_dir] = _Folder(out_dir, settings, stack)
        records = _settle_jobs(jobs, folders, on_done, force, workers)
        for out_dir in folders:
            with contextlib.suppress(OSError):  # empty once every staged model is placed
                staging_dir(out_dir).rmdir()
        return records


def _settle_jobs(jobs, folders, on_done, force, workers) -> list[ExportRecord]:
    records: dict[int, ExportRecord] = {}
    current: dict[str, ExportRecord] = {}  # key -> a current model (its folder holds it)
    todo: dict[str, list[int]] = {}  # key -> indices of the jobs that need that model
    for n, job in enumerate(jobs):
        key = cache_key(job.case, job.settings)
        previous = folders[job.out_dir].models.get(job.case.name)
        path = job.out_dir / job.case.name / "model.onnx"
        if _is_current(path, key, previous, force, job.out_dir):
            records[n] = ExportRecord.from_manifest(previous, job.out_dir)
            current.setdefault(key, records[n])
            if on_done:
                on_done(records[n])
        else:
            todo.setdefault(key, []).append(n)

    def settle(key: str, record: ExportRecord) -> None:
        """Place one settled model in every folder that needs it: the staged export where it
        was made, a copy of the placed file everywhere else."""
        source = None if record.staged else Path(record.location)
        for n in todo[key]:
            folder = folders[jobs[n].out_dir]
            if source is None and Path(record.folder) == folder.out_dir:
                staged = Path(record.staged)
            else:
                staged = folder.stage_copy(record, source or Path(record.staged))
            records[n] = folder.place(replace(record, cached=False), staged)
            source = source or Path(records[n].location)
            if on_done:
                on_done(records[n])

    to_export = []
    for key in todo:
        if key in current:
            settle(key, current[key])
        else:
            to_export.append(key)
    to_export.sort(key=lambda k: _size_rank(jobs[todo[k][0]].case))
    first = {key: jobs[todo[key][0]] for key in to_export}
    # A model needed in several folders is exported into the first; the others copy it.
    for key in to_export:
        todo[key].sort(key=lambda n: jobs[n].out_dir != first[key].out_dir)
    count = min(workers or min(2, os.cpu_count() or 1), len(to_export))
    if count <= 1:
        for key in to_export:
            job = first[key]
            settle(key, export_case(job.case, job.settings, job.out_dir))
    else:
        for key, record in _export_in_workers(to_export, first, count):
            settle(key, record)
    return [records[n] for n in range(len(jobs))]


def _export_in_workers(keys: list[str], first: dict[str, ExportJob], count: int):
    """(key, record) as each export finishes, from `count` worker processes that end with
    this process: on an error, Ctrl-C or SIGTERM the pool is terminated before it propagates,
    and a worker whose parent dies (even by SIGKILL) exits on its own."""
    context = multiprocessing.get_context("spawn")  # fork after torch starts threads can hang
    # Ctrl-C reaches the whole process group, and only the parent should act on it, by
    # terminating the pool. Workers start with SIGINT ignored (an ignored signal stays ignored
    # across exec, and Python then installs no KeyboardInterrupt handler). The parent's main
    # thread also blocks it while spawning (Linux never drops a blocked signal as ignored), so a
    # Ctrl-C in that window of a few milliseconds reaches it once its handler is back, unless
    # another thread (torch's) took it meanwhile: then that one Ctrl-C is lost, a second works.
    blocking = hasattr(signal, "pthread_sigmask")  # not on Windows
    if blocking:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        pool = context.Pool(count, initializer=_worker_init, initargs=(os.getpid(),))
    finally:
        signal.signal(signal.SIGINT, previous)
        if blocking:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        pending = {
            key: pool.apply_async(
                _export_by_name, (first[key].case.name, first[key].settings, first[key].out_dir)
            )
            for key in keys
        }
        while pending:
            done = [key for key, result in pending.items() if result.ready()]
            for key in done:
                yield key, pending.pop(key).get()
            if not done:
                next(iter(pending.values())).wait(0.2)
        pool.close()
    finally:
        pool.terminate()
        pool.join()


def _worker_init(parent_pid: int) -> None:
    """Export workers leave Ctrl-C to the parent and end when it ends."""
    if hasattr(signal, "pthread_sigmask"):  # blocked by the parent while it spawned us
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:  # the kernel sends SIGTERM when the parent dies, SIGKILL included
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        except OSError:
            pass
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()


def _exit_with_parent(parent_pid: int) -> None:
    """Polls for the parent, where prctl is missing or the parent died before it was set."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(1)


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
