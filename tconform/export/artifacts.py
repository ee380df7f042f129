"""The artifacts folder: exported models, their manifest, and the rules of the export cache.

`DIR/<case>/model.onnx` uses the same case names as golden/, so a model and its goldens form one
standard ONNX test case. `DIR/manifest.json` records per model the component, config, seed,
exporter, opset, attention kernel, IR version, inputs/outputs with dynamic axes, sha256 and the
cache key.

The cache only ever replaces its own, unchanged files. A model is exported again when its key
(tconform.export.settings.cache_key) changes, but only if the manifest records the file and the
file's sha256 still equals the recorded one. A file with no manifest entry, in a folder with no
manifest, or changed since tconform wrote it is somebody else's model: it is never replaced,
only refused (`--model CASE=PATH` verifies it as it is; `tconform export --force` replaces it).
A folder holds models of one exporter, opset, dtype and attention kernel, so that nothing
switches a folder's precision or graph silently. A new model is staged in the folder and renamed
into place only after the manifest records it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from tconform import registry
from tconform.config import ATTENTION_KERNELS, MAX_SEED
from tconform.errors import UsageError
from tconform.export.exporter import checked_model, dynamic_axes, export_to, exporter_error_line
from tconform.export.settings import (
    DTYPES,
    EXPORTERS,
    ExportSettings,
    cache_key,
    quantization,
)
from tconform.files import (
    atomic_write_bytes,
    atomic_write_json,
    require_inside,
    require_unchanged,
    sha256_file,
)
from tconform.folders import (
    ARTIFACTS,
    BENCH_AREA,
    CHECK_AREA,
    CHECK_RECORD,
    DOC_AREA,
    GENERATION_AREA,
    MANIFEST,
    folder_lock,
    is_lock,
    manifest_kind,
    read_json_manifest,
    require_artifacts_folder,
    require_not_link,
)
from tconform.registry import Case
from tconform.schema import (
    SHA256,
    config_of,
    expect_int,
    expect_names,
    expect_object,
    expect_str,
    fail,
    one_of,
)
from tconform.versions import library_versions
from tconform.weights import available


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
    # int8, int4: the quantiser's arguments (settings.INT8_QUANTIZATION, INT4_QUANTIZATION)
    quantization: dict[str, object] | None = None
    checkpoint: str = ""  # the trained checkpoint whose weights it holds ("": seeded weights)
    folder: str = ""  # the artifacts folder it lives in (not part of the manifest entry)
    staged: str = ""  # where a new export waits to be placed (not part of the manifest entry)

    @property
    def location(self) -> str:
        return str(Path(self.folder) / self.path)

    def to_manifest(self) -> dict[str, object]:
        entry = asdict(self)
        for transient in ("cached", "folder", "staged"):
            entry.pop(transient)
        for optional in ("quantization", "checkpoint"):
            if not entry[optional]:
                del entry[optional]
        return entry

    @classmethod
    def from_manifest(cls, entry: dict, folder: Path) -> ExportRecord:
        known = {f.name for f in fields(cls)} - {"cached", "folder", "staged"}
        return cls(
            **{k: v for k, v in entry.items() if k in known}, cached=True, folder=str(folder)
        )


def read_artifacts_manifest(out_dir: Path) -> dict:
    """The artifacts folder's manifest ({} for a new folder); a golden folder is refused."""
    require_artifacts_folder(out_dir)
    path = out_dir / MANIFEST
    if not path.exists():
        return {}
    manifest_kind(out_dir)  # another tool's manifest.json is refused, never replaced
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
    if "seed" in data:  # the seed the models' weights were drawn with
        expect_int(data["seed"], path, "'seed'", 0, MAX_SEED)
    if "attention" in data and not one_of(data["attention"], ATTENTION_KERNELS):
        raise fail(path, "'attention'", f"is not one of {', '.join(ATTENTION_KERNELS)}")
    _check_checkpoint(data, path, "'checkpoint'")
    if "config" in data:
        config_of(data, path)
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
        _check_checkpoint(entry, path, f"{where} 'checkpoint'")


def _check_checkpoint(data: dict, path: Path, where: str) -> None:
    """A recorded checkpoint is a name of one tconform holds (never a path), or "" (none)."""
    name = data.get("checkpoint", "")
    if name != "" and not one_of(name, available()):
        raise fail(path, where, f"is not one of the checkpoints tconform holds: {name!r:.80}")


def is_current(path: Path, key: str, previous: dict | None, force: bool, out_dir: Path) -> bool:
    """Whether the model at `path` can be reused as it is (False: export it).

    Only tconform's own unchanged file may be replaced: a file that exists with no manifest
    entry, or whose bytes differ from the recorded sha256, is refused unless `force`; one that
    is a symlink leading out of the folder is refused."""
    require_inside(out_dir, path)  # also when missing: its case folder may lead out
    for step in (path.parent, path):  # a link even where it stays inside the folder
        require_not_link(step, "in an artifacts folder")
    if not path.exists():
        return False
    if not path.is_file():
        raise UsageError(f"{path}: exists and is not a regular file; tconform will not replace it")
    name = path.parent.name
    replace = (
        "replace it with `tconform export --force`"
        if registry.exporting_command(name) == "tconform export"
        else "remove it to have it exported anew"
    )
    ways_on = f"verify it as it is with --model {name}={path}, or {replace}"
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


def require_new_or_artifacts(out_dir: Path) -> None:
    """Models go into an artifacts folder, or a folder laid out as one: new, empty, or holding
    only what tconform puts there (`_laid_out`); never among files nobody said are tconform's.
    Checked too on DIR where a command's models go to an area of it (DIR/doc/CONFIG,
    DIR/generation). Never through a symbolic link, whichever command writes there."""
    require_not_link(out_dir, "an artifacts folder")
    if (out_dir / MANIFEST).exists():
        manifest_kind(out_dir)  # another tool's manifest.json is refused, never replaced
        return
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir}: not a folder; models go into a new or artifacts folder")
    if not out_dir.exists():
        return
    others = sorted(p.name for p in out_dir.iterdir() if not _laid_out(p))
    if others:
        raise UsageError(
            f"{out_dir}: holds {others[0]!r} and no artifacts manifest; models go into a new or "
            "empty folder, or one tconform export made (export --out DIR, verify --artifacts DIR)"
        )


def _laid_out(entry: Path) -> bool:
    """Whether `entry` of a folder without a manifest is what tconform puts there, whichever
    command ran first: locks, staging, a case folder with its model.onnx alone (then judged on
    its own: `is_current`), and the areas of its other commands."""
    if is_lock(entry):
        return True
    if entry.is_symlink() or not entry.is_dir():
        return False
    if entry.name == STAGING:
        return True  # cleared by clear_staging, which judges what it holds
    if entry.name in registry.exportable_names():
        return [p.name for p in entry.iterdir()] == ["model.onnx"]
    if entry.name == GENERATION_AREA or entry.name.startswith(f"{GENERATION_AREA}-fill"):
        return _marked(entry, MANIFEST)
    if entry.name == CHECK_AREA:
        return _holds_only(entry, lambda p: _marked(p, CHECK_RECORD))
    if entry.name == DOC_AREA:
        return _holds_only(entry, lambda p: _marked(p, MANIFEST))
    if entry.name == BENCH_AREA:  # a preset's exports, or only its generation models
        return _holds_only(
            entry,
            lambda p: (
                _marked(p, MANIFEST)
                or _holds_only(p, lambda q: q.name == GENERATION_AREA and _marked(q, MANIFEST))
            ),
        )
    return False


def _marked(folder: Path, marker: str) -> bool:
    return folder.is_dir() and not folder.is_symlink() and (folder / marker).is_file()


def _holds_only(folder: Path, own: Callable[[Path], bool]) -> bool:
    """Whether `folder` (a real folder) holds nothing but locks and entries `own` accepts."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    return all(is_lock(p) or own(p) for p in folder.iterdir())


def clear_staging(out_dir: Path) -> None:
    """What an earlier run staged and did not place, removed: only what tconform stages (a
    folder per model, CASE.XXXXXXXX); anything else there is refused, never deleted, and so is
    a link, which models would go through."""
    staging = staging_dir(out_dir)
    if not staging.exists() and not staging.is_symlink():
        return
    if staging.is_symlink() or not staging.is_dir():
        raise UsageError(
            f"{staging}: not a folder tconform stages its exports in (a link or a file); "
            "tconform writes through no link it did not make and deletes nothing it did not "
            "write (remove it)"
        )
    known = registry.exportable_names()
    for entry in staging.iterdir():
        case, _, suffix = entry.name.rpartition(".")
        named = not entry.is_symlink() and entry.is_dir() and case in known and len(suffix) == 8
        # what export_case writes there: model.onnx, through a temporary .model.onnx.*.tmp
        if not named or not all(_staged_file(p) for p in entry.iterdir()):
            raise UsageError(
                f"{entry}: not an export tconform staged; it removes only those (move it away)"
            )
    shutil.rmtree(staging)


def _staged_file(path: Path) -> bool:
    name = path.name
    own = name == "model.onnx" or (name.startswith(".model.onnx.") and name.endswith(".tmp"))
    return own and path.is_file() and not path.is_symlink()


def export_case(case: Case, settings: ExportSettings, out_dir: Path) -> ExportRecord:
    """Export one case into out_dir's staging folder and describe it. Only the process that
    records it in the manifest renames it into place (see `ArtifactsFolder.place`), so a killed run
    never leaves a model that the manifest does not know."""
    staged = Path(tempfile.mkdtemp(prefix=f"{case.name}.", dir=_made(staging_dir(out_dir))))
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "model.onnx"
        try:
            export_to(case, settings, raw)
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
        quantization=quantization(settings.dtype),
        checkpoint=settings.checkpoint,
        folder=str(out_dir),
        staged=str(staged / "model.onnx"),
    )


def _made(folder: Path) -> Path:
    require_unchanged(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# What a folder's models have in common; a folder never mixes them.
FOLDER_SETTINGS = ("exporter", "opset", "dtype", "attention", "checkpoint")


def folder_settings(out_dir: Path) -> dict[str, object] | None:
    """The exporter, opset, dtype and attention kernel of the models an artifacts folder holds
    (None: a new or empty folder, whose settings the first export decides)."""
    manifest = read_artifacts_manifest(out_dir)
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
    found["checkpoint"] = found["checkpoint"] or ""  # before checkpoints: seeded weights
    return found


class ArtifactsFolder:
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
        require_not_link(out_dir, "an artifacts folder")
        require_new_or_artifacts(out_dir)  # before the lock file goes beside it
        stack.enter_context(folder_lock(_made(out_dir)))
        require_new_or_artifacts(out_dir)  # and under the lock, which another run may have held
        clear_staging(out_dir)  # an earlier run's leftovers
        self.models: dict = dict(read_artifacts_manifest(out_dir).get("models", {}))
        held = folder_settings(out_dir)
        wanted = {k: getattr(settings, k) for k in FOLDER_SETTINGS}
        if held is not None and held != wanted:
            raise UsageError(
                f"{out_dir} holds {_describe(held)} models; export {_describe(wanted)} into a "
                "folder of its own (export --out DIR, verify --artifacts DIR)"
            )

    def place(self, record: ExportRecord, staged: Path) -> ExportRecord:
        """Record `record` and move its staged file into place."""
        target = require_inside(self.out_dir, self.out_dir / record.path)
        entry = record.to_manifest()
        if target.is_file():
            entry["previous_sha256"] = sha256_file(target)
        self.models[record.case] = entry
        self._write_manifest()
        require_unchanged(target)
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
                **({"checkpoint": self.settings.checkpoint} if self.settings.checkpoint else {}),
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
    weights = f" (checkpoint {settings['checkpoint']})" if settings.get("checkpoint") else ""
    return f"{settings['exporter']} opset {settings['opset']} {settings['dtype']}{kernel}{weights}"
