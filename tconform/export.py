"""torch -> ONNX: one model per case, cached by what determines its bytes, with a manifest.

`DIR/<case>/model.onnx` uses the same case names as golden/, so a model and its goldens form one
standard ONNX test case. `DIR/manifest.json` records per model the component, config, seed,
exporter, opset, IR version, inputs/outputs with dynamic axes, sha256 and the cache key. A model
is re-exported only when its key (config, seed, case, exporter, opset, dtype, library versions,
and the source of the code that defines the model) changes or its file no longer matches.
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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch

from tconform import registry
from tconform.config import ModelConfig
from tconform.errors import UsageError
from tconform.files import atomic_write_bytes, atomic_write_json, sha256_file
from tconform.registry import Case, Shape
from tconform.versions import library_versions
from tconform.weights import DEFAULT_SEED, load_params, make_params

EXPORTERS = ("dynamo", "torchscript")
DTYPES = {"float32": torch.float32, "float16": torch.float16}
DEFAULT_OPSET = 18
MAX_IR_VERSION = 10  # ONNX Runtime 1.30/1.31 refuse IR > 13; the exporters write <= 10
MANIFEST = "manifest.json"

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

    def to_manifest(self) -> dict[str, object]:
        entry = asdict(self)
        entry.pop("cached")
        return entry


def read_manifest(out_dir: Path) -> dict:
    path = out_dir / MANIFEST
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable manifest ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("models", {}), dict):
        raise UsageError(f"{path}: not a tconform artifacts manifest")
    return data


def _is_current(path: Path, key: str, previous: dict | None, repair: bool) -> bool:
    """Whether the model at `path` can be reused. A file that the manifest says is current but
    whose bytes changed is an error unless `repair` (tconform export) rebuilds it."""
    if not previous or previous.get("key") != key or not path.exists():
        return False
    if sha256_file(path) == previous.get("sha256"):
        return True
    if repair:
        return False
    raise UsageError(
        f"{path}: sha256 differs from the artifacts manifest (modified or truncated); "
        "run `tconform export` to rebuild it"
    )


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
    )


def _export_by_name(name: str, settings: ExportSettings, out_dir: Path) -> ExportRecord:
    return export_case(registry.get_case(name), settings, out_dir)


def export_cases(
    cases: Iterable[Case],
    settings: ExportSettings,
    out_dir: Path,
    on_done: Callable[[ExportRecord], None] | None = None,
    repair: bool = True,
    jobs: int | None = None,
) -> list[ExportRecord]:
    """Export (or reuse) every case and keep the manifest current; `on_done` reports progress.

    Models that need exporting are exported in `jobs` worker processes (default: one per core,
    at most two, since each export is single-threaded Python tracing).
    """
    manifest = read_manifest(out_dir)
    models: dict = dict(manifest.get("models", {}))
    records: dict[str, ExportRecord] = {}
    todo = []
    for case in cases:
        previous = models.get(case.name)
        if _is_current(
            out_dir / case.name / "model.onnx", cache_key(case, settings), previous, repair
        ):
            records[case.name] = ExportRecord(**{**previous, "cached": True})
            if on_done:
                on_done(records[case.name])
        else:
            todo.append(case)

    def finished(record: ExportRecord) -> None:
        records[record.case] = record
        models[record.case] = record.to_manifest()
        # Rewritten after every model, so an interrupted run keeps what it finished.
        atomic_write_json(
            out_dir / MANIFEST,
            {
                "tool": "tconform",
                "config": settings.cfg.to_dict(),
                "seed": settings.seed,
                "exporter": settings.exporter,
                "dtype": settings.dtype,
                "versions": library_versions(),
                "models": models,
            },
        )
        if on_done:
            on_done(record)

    workers = min(jobs or min(2, os.cpu_count() or 1), len(todo))
    if workers <= 1:
        for case in todo:
            finished(export_case(case, settings, out_dir))
    else:
        context = multiprocessing.get_context("spawn")  # fork after torch starts threads can hang
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = [pool.submit(_export_by_name, c.name, settings, out_dir) for c in todo]
            for future in as_completed(futures):
                finished(future.result())
    return [records[c.name] for c in cases]
