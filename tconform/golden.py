"""Goldens: the float64 oracle's outputs, stored in the ONNX test-data layout.

    golden/manifest.json                        config, seed, sets, tolerances, versions, sha256
    golden/<case>/test_data_set_N/input_K.pb    serialized TensorProto, named as the model's input K
    golden/<case>/test_data_set_N/output_K.pb   the exact output rounded once to float32

ONNX's backend test runner and ONNX Runtime's onnx_test_runner read this layout, so a model from
`tconform export` and its golden folder form one standard ONNX test case.

Regenerating is deterministic up to the summation order of float64 matrix products, which BLAS
may change between machines; once in a great while that flips the float32 rounding of an output.
`check` therefore allows one unit in the last place of float32 and reports how many elements
needed it.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from tconform import registry
from tconform.compare import TOLERANCES
from tconform.config import ModelConfig
from tconform.errors import UsageError
from tconform.files import (
    atomic_write_json,
    files_under,
    new_folder,
    require_inside,
    sha256_bytes,
)
from tconform.folders import (
    GOLDEN,
    MANIFEST,
    folder_lock,
    manifest_kind,
    read_json_manifest,
    require_replaceable_golden_folder,
)
from tconform.registry import Case, Shape
from tconform.schema import TENSOR_FILE, check_golden_manifest
from tconform.versions import library_versions, tool_version

STORED_DTYPE = np.float32


def input_shapes(cfg: ModelConfig) -> tuple[Shape, ...]:
    """The input sets: the smallest (1 x 1), a padded mid-size one with source and target of
    different lengths, and the preset's maximum sequence length."""
    mid = Shape(2, min(7, cfg.max_seq_len), min(5, cfg.max_seq_len))
    return (Shape(1, 1, 1), mid, Shape(3, cfg.max_seq_len, cfg.max_seq_len))


@dataclass
class InputSet:
    name: str  # test_data_set_N
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]  # float32, the oracle's value correctly rounded


def generate_case(case: Case, cfg: ModelConfig, seed: int) -> list[InputSet]:
    """The case's input sets and exact outputs, in memory."""
    params = case.make_params(cfg, seed)
    sets = []
    for n, shape in enumerate(input_shapes(cfg)):
        rng = np.random.default_rng([seed, zlib.crc32(case.name.encode()), n])
        inputs = registry.make_inputs(case, cfg, shape, rng)
        exact = registry.run_oracle(case, cfg, params, inputs)
        outputs = {
            spec.name: value.astype(STORED_DTYPE)
            for spec, value in zip(case.outputs(cfg), exact, strict=True)
        }
        sets.append(InputSet(f"test_data_set_{n}", inputs, outputs))
    return sets


def _tensor_files(input_set: InputSet) -> dict[str, bytes]:
    files = {}
    for kind, tensors in (("input", input_set.inputs), ("output", input_set.outputs)):
        for k, (name, array) in enumerate(tensors.items()):
            proto = numpy_helper.from_array(array, name=name)
            files[f"{input_set.name}/{kind}_{k}.pb"] = proto.SerializeToString()
    return files


def write(
    golden_dir: Path,
    cfg: ModelConfig,
    seed: int,
    cases: tuple[Case, ...],
    preset: str,
    force: bool = False,
    on_case=None,
    only_these: bool = False,
) -> dict:
    """Write goldens for `cases` into golden_dir, atomically (a new folder swapped into place).

    An existing golden folder is replaced as a whole only with force=True, and force replaces
    nothing but a golden folder (or fills an empty one). With only_these (`golden --case`), an
    existing golden folder keeps its other cases: the named ones are added, or replaced with
    force; the folder's preset and seed must be the ones asked for.
    """
    header = {
        "kind": GOLDEN,
        "tool": "tconform",
        "version": tool_version(),
        "preset": preset,
        "config": cfg.to_dict(),
        "seed": seed,
        "input_sets": [vars(s) for s in input_shapes(cfg)],
        "stored_dtype": "float32",
        "tolerances": tolerance_table(),
        "versions": library_versions(),
    }

    def stored() -> Iterator[StoredCase]:
        for case in cases:
            sets = generate_case(case, cfg, seed)
            yield StoredCase(
                case.name,
                sets,
                {
                    "component": case.component,
                    "tolerance_class": case.tolerance,
                    "inputs": [s.name for s in case.inputs(cfg)],
                    "outputs": [s.name for s in case.outputs(cfg)],
                    "sets": {
                        s.name: {
                            **{n: list(a.shape) for n, a in s.inputs.items()},
                            **{n: list(a.shape) for n, a in s.outputs.items()},
                        }
                        for s in sets
                    },
                },
            )
            if on_case:
                on_case(case)

    def keep() -> dict:
        return _cases_to_keep(golden_dir, cfg, seed, preset, cases, force)

    return write_folder(golden_dir, header, stored(), force, keep if only_these else None)


@dataclass(frozen=True)
class StoredCase:
    """One case as a golden folder stores it: its input sets' tensor files under NAME/, and its
    manifest entry (the writer adds the files' sha256s)."""

    name: str
    sets: list[InputSet]
    entry: dict


def write_folder(
    golden_dir: Path,
    header: dict,
    cases: Iterable[StoredCase],
    force: bool,
    keep: Callable[[], dict] | None = None,
) -> dict:
    """The one golden writer (tconform's cases and the generation goldens alike): with the
    folder locked, every case's files into a staging folder beside it, the manifest (`header`,
    then the cases with their files' sha256s), swapped into place. An existing folder is
    replaced only with `force`, and only a golden folder (or an empty one); `keep`, called
    under the lock where the folder holds goldens, names the entries of its cases to keep byte
    for byte (`golden --case`)."""
    require_replaceable_golden_folder(golden_dir)  # before the lock file goes beside it
    golden_dir.parent.mkdir(parents=True, exist_ok=True)
    with folder_lock(golden_dir):
        kept: dict = {}
        if keep is not None and manifest_kind(golden_dir) == GOLDEN:
            kept = keep()
        elif golden_dir.exists() and any(golden_dir.iterdir()) and not force:
            raise UsageError(f"{golden_dir} already holds files; pass --force to replace goldens")
        require_replaceable_golden_folder(golden_dir)
        _require_same_kind(golden_dir, bool(header.get("generation")))
        _remove_leftovers(golden_dir)
        return _write_locked(golden_dir, header, cases, kept)


def _require_same_kind(golden_dir: Path, generation: bool) -> None:
    """--force replaces goldens with goldens of their own kind: the generation goldens never
    take the place of the components' (nor these theirs), which no later run would find."""
    if manifest_kind(golden_dir) != GOLDEN:
        return
    held = read_json_manifest(golden_dir / MANIFEST).get("generation") is True
    if held != generation:
        kinds = {True: "generation goldens", False: "the components' goldens"}
        raise UsageError(
            f"{golden_dir}: holds {kinds[held]}; golden --force replaces goldens of one kind "
            f"only, never with {kinds[generation]} (name another folder)"
        )


def _cases_to_keep(golden_dir, cfg, seed, preset, cases, force) -> dict:
    """The manifest entries of the golden folder's cases that `golden --case` leaves alone."""
    held = read_golden_manifest(golden_dir)
    if (held["config"], held["seed"], held.get("preset")) != (cfg.to_dict(), seed, preset):
        raise UsageError(
            f"{golden_dir} holds goldens of preset {held.get('preset')!r}, seed {held['seed']}; "
            "golden --case adds cases made the same way (or replace the folder with --force "
            "and no --case)"
        )
    replaced = [case.name for case in cases if case.name in held["cases"]]
    if replaced and not force:
        raise UsageError(
            f"{golden_dir} already holds goldens for {replaced[0]!r}; pass --force to replace "
            "them (the folder's other cases are kept)"
        )
    return {name: entry for name, entry in held["cases"].items() if name not in replaced}


def _leftovers(golden_dir: Path) -> list[Path]:
    """Staging and retired folders of earlier writes of this golden folder that were killed,
    as tconform left them: named as tempfile.mkdtemp names them, holding nothing but goldens
    (a staging folder: manifest.json and case folders of tensor files; a retired one: the old
    golden folder, nothing of it unlisted). A folder of the user's that only looks like one is
    kept."""
    name = re.compile(rf"\.{re.escape(golden_dir.name)}\.(staging|retired)-[a-z0-9_]{{8}}")
    found = []
    for path in golden_dir.parent.iterdir():
        kind = name.fullmatch(path.name)
        if kind is None or path.is_symlink() or not path.is_dir():
            continue
        if kind.group(1) == "retired":
            held = [p.name for p in path.iterdir()]
            old = path / golden_dir.name
            if held and (held != [golden_dir.name] or not _only_goldens(old)):
                continue
        elif not _only_goldens(path, manifest_optional=True):
            continue
        found.append(path)
    return found


def _only_goldens(folder: Path, manifest_optional: bool = False) -> bool:
    """Whether `folder` holds nothing but golden files: manifest.json and CASE/SET/TENSOR.pb
    (the manifest may be missing from a staging folder cut short), no symlink anywhere."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    if any(p.is_symlink() for p in folder.rglob("*")):
        return False
    files = files_under(folder)
    if not manifest_optional and MANIFEST not in files:
        return False
    return all(rel == MANIFEST or TENSOR_FILE.fullmatch(rel.partition("/")[2]) for rel in files)


def _remove_leftovers(golden_dir: Path) -> None:
    for leftover in _leftovers(golden_dir):
        shutil.rmtree(leftover, ignore_errors=True)


def _write_locked(golden_dir: Path, header: dict, cases: Iterable[StoredCase], kept: dict) -> dict:
    staging = new_folder(golden_dir.parent, f".{golden_dir.name}.staging-")
    try:
        for name in kept:  # the folder's other cases, byte for byte
            shutil.copytree(golden_dir / name, staging / name)
        entries = dict(kept)
        for case in cases:
            hashes = {}
            for input_set in case.sets:
                for rel, data in _tensor_files(input_set).items():
                    path = staging / case.name / rel
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data)
                    hashes[rel] = sha256_bytes(data)
            entries[case.name] = {**case.entry, "sha256": hashes}
        manifest = {**header, "cases": entries}
        atomic_write_json(staging / MANIFEST, manifest)
        _swap_into_place(staging, golden_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def tolerance_table() -> dict[str, dict[str, float]]:
    """compare.TOLERANCES as the manifest records it for tools without tconform: atol, rtol,
    the output RMS the atol stands for (an output of a smaller RMS is held to atol * RMS /
    atol_rms) and, for the rows that have one, the SQNR floor in dB."""
    table = {}
    for (precision, klass), t in TOLERANCES.items():
        row = {"atol": t.atol, "rtol": t.rtol, "atol_rms": t.atol_rms}
        if t.min_sqnr_db is not None:
            row["min_sqnr_db"] = t.min_sqnr_db
        table[f"{precision}/{klass}"] = row
    return table


def _swap_into_place(staging: Path, golden_dir: Path) -> None:
    """Rename the finished folder into place; the old one is removed only afterwards."""
    if golden_dir.exists():
        retired = Path(
            tempfile.mkdtemp(prefix=f".{golden_dir.name}.retired-", dir=golden_dir.parent)
        )
        golden_dir.rename(retired / golden_dir.name)
        staging.rename(golden_dir)
        shutil.rmtree(retired)
    else:
        staging.rename(golden_dir)


# --- reading -------------------------------------------------------------------------------


def read_golden_manifest(golden_dir: Path) -> dict:
    if not golden_dir.is_dir():
        raise UsageError(f"{golden_dir}: no golden folder (run `tconform golden` to make one)")
    path = golden_dir / MANIFEST
    if not path.exists():
        raise UsageError(f"{path}: missing; {golden_dir} is empty or not a golden folder")
    manifest = read_json_manifest(require_inside(golden_dir, path))
    if manifest.get("kind", GOLDEN) != GOLDEN or "models" in manifest:
        raise UsageError(f"{path}: an artifacts manifest, not a golden one")
    check_golden_manifest(manifest, path)
    return manifest


def manifest_config(manifest: dict) -> ModelConfig:
    return ModelConfig.from_dict(manifest["config"])


# A serialized tensor is its raw bytes plus a small header (name, dims, type); anything much
# larger than the manifest's shape says is refused before it is read.
_HEADER_BYTES = 4096
_LARGEST_ITEM = 8  # int64 ids


def _checked_bytes(path: Path, expected_sha: str, shape: list[int] | None, root: Path) -> bytes:
    """A golden file's bytes: a regular file inside `root` (the golden folder), no larger than
    its shape allows, with the manifest's sha256."""
    if not path.is_file():
        raise UsageError(f"{path}: missing or not a regular file")
    require_inside(root, path)
    if shape is not None:
        limit = int(np.prod(shape, dtype=np.int64)) * _LARGEST_ITEM + _HEADER_BYTES
        if path.stat().st_size > limit:
            raise UsageError(
                f"{path}: {path.stat().st_size} bytes, more than its shape {shape} can hold"
            )
    data = path.read_bytes()
    if sha256_bytes(data) != expected_sha:
        raise UsageError(f"{path}: sha256 differs from the manifest (file changed or corrupt)")
    return data


def read_tensor(path: Path, expected_sha: str, shape: list[int] | None, root: Path) -> tuple:
    """(name, array) of a golden .pb (tconform's cases and the generation goldens alike), its
    bytes checked (_checked_bytes), with its data inline
    (external data is refused: it would be read from wherever the tensor points and escape the
    hash)."""
    data = _checked_bytes(path, expected_sha, shape, root)
    proto = onnx.TensorProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:
        raise UsageError(f"{path}: not a serialized TensorProto ({exc})") from None
    if proto.data_location == onnx.TensorProto.EXTERNAL:
        raise UsageError(f"{path}: keeps its data in an external file; goldens hold it inline")
    try:
        array = numpy_helper.to_array(proto)
    except Exception as exc:
        raise UsageError(f"{path}: not a serialized TensorProto ({exc})") from None
    if list(proto.dims) != list(array.shape) or (shape is not None and array.shape != tuple(shape)):
        raise UsageError(
            f"{path}: dims {list(proto.dims)[:8]} are not the shape {shape} its manifest records"
        )
    return proto.name, array


def expected_files(case: Case, cfg: ModelConfig, set_names) -> list[str]:
    """The files a golden case folder holds: one .pb per input and output per set."""
    return [
        f"{set_name}/{kind}_{k}.pb"
        for set_name in set_names
        for kind, specs in (("input", case.inputs(cfg)), ("output", case.outputs(cfg)))
        for k in range(len(specs))
    ]


def _case_files(golden_dir: Path, manifest: dict, case: Case, cfg: ModelConfig) -> Iterator:
    """(set name, kind, spec, path, sha256, shape) of each file of a case, in order, once the
    case folder is known to hold exactly the files its manifest lists, each with a sha256, and
    at least one input set."""
    entry = manifest["cases"].get(case.name)  # validated by read_golden_manifest
    manifest_path = golden_dir / MANIFEST
    if entry is None:
        raise UsageError(f"{manifest_path}: no goldens for case {case.name!r}")
    if not entry["sets"]:
        raise UsageError(f"{manifest_path}: case {case.name!r} has no input sets: nothing to check")
    _require_the_cases_own(entry, case, cfg, manifest_path)
    case_dir = golden_dir / case.name
    expected = expected_files(case, cfg, entry["sets"])
    unlisted = sorted(files_under(case_dir) - set(expected)) if case_dir.is_dir() else []
    if unlisted:
        raise UsageError(f"{case_dir / unlisted[0]}: not listed in {manifest_path}")
    unhashed = [rel for rel in expected if not isinstance(entry["sha256"].get(rel), str)]
    if unhashed:
        raise UsageError(f"{manifest_path}: no sha256 for {case.name}/{unhashed[0]}")
    for set_name, shapes in entry["sets"].items():
        for kind, specs in (("input", case.inputs(cfg)), ("output", case.outputs(cfg))):
            for k, spec in enumerate(specs):
                rel = f"{set_name}/{kind}_{k}.pb"
                yield set_name, kind, spec, case_dir / rel, entry["sha256"][rel], shapes


def _require_the_cases_own(entry: dict, case: Case, cfg: ModelConfig, manifest_path: Path) -> None:
    """What a case's entry records of the case is the case's: its tensors' names, its tolerance
    class, and a shape for each tensor in every set (a set without one was read unchecked)."""
    inputs, outputs = [s.name for s in case.inputs(cfg)], [s.name for s in case.outputs(cfg)]
    own = {"inputs": inputs, "outputs": outputs, "tolerance_class": case.tolerance}
    for field, value in own.items():
        if field in entry and entry[field] != value:
            raise UsageError(
                f"{manifest_path}: case {case.name!r} {field} {entry[field]!r:.80} is not the "
                f"case's {value!r}"
            )
    for set_name, shapes in entry["sets"].items():
        if sorted(shapes) != sorted([*inputs, *outputs]):
            raise UsageError(
                f"{manifest_path}: case {case.name!r} set {set_name!r} has shapes for "
                f"{sorted(shapes)!r:.80}, not for the case's tensors {[*inputs, *outputs]!r}"
            )


def require_intact(golden_dir: Path, manifest: dict, cases, cfg: ModelConfig) -> None:
    """Every golden file of `cases`, checked before the first case runs: the case folders hold
    exactly the files the manifest lists, each a regular file inside the folder with its
    recorded sha256. A corrupt or replaced file is one line naming it before anything is
    exported or run, not when its case is reached (read_case checks each again as it loads it)."""
    for case in cases:
        for _set, _kind, spec, path, sha, shapes in _case_files(golden_dir, manifest, case, cfg):
            _checked_bytes(path, sha, shapes.get(spec.name), golden_dir)


def read_case(golden_dir: Path, manifest: dict, case: Case, cfg: ModelConfig) -> list[InputSet]:
    """Load a case's input sets, checking each file's sha256, names, shapes and dtypes. The case
    folder must hold exactly the files its manifest lists, and at least one input set."""
    loaded: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    for set_name, kind, spec, path, sha, shapes in _case_files(golden_dir, manifest, case, cfg):
        name, array = read_tensor(path, sha, shapes.get(spec.name), golden_dir)
        _check_tensor(path, name, array, spec, shapes, cfg)
        loaded.setdefault(set_name, {"input": {}, "output": {}})[kind][spec.name] = array
    return [InputSet(name, sets["input"], sets["output"]) for name, sets in loaded.items()]


def _check_tensor(path, name, array, spec, shapes, cfg: ModelConfig) -> None:
    if name != spec.name:
        raise UsageError(f"{path}: tensor is named {name!r}, the model's tensor is {spec.name!r}")
    if list(array.shape) != list(shapes.get(spec.name, array.shape)) or array.ndim != len(
        spec.axes
    ):
        raise UsageError(f"{path}: shape {list(array.shape)} does not match {spec.axes}")
    want = {
        "float": np.float32,
        "src_ids": np.int64,
        "tgt_ids": np.int64,
        "src_keep": np.bool_,
        "tgt_keep": np.bool_,
        "attn_mask": np.bool_,
    }[spec.kind]
    if array.dtype != want:
        raise UsageError(f"{path}: dtype {array.dtype}, expected {np.dtype(want)}")
    for axis, size in zip(spec.axes, array.shape, strict=True):
        if axis in ("src_seq", "tgt_seq") and size > cfg.max_seq_len:
            raise UsageError(
                f"{path}: sequence length {size} exceeds the preset's maximum {cfg.max_seq_len}"
            )
    if spec.kind in ("src_ids", "tgt_ids") and array.size:
        vocab = cfg.src_vocab if spec.kind == "src_ids" else cfg.tgt_vocab
        low, high = int(array.min()), int(array.max())
        if low < 0 or high >= vocab:
            raise UsageError(
                f"{path}: token id {high if high >= vocab else low} outside 0..{vocab - 1}"
            )


# --- checking for drift ----------------------------------------------------------------------


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Units in the last place between two float32 arrays of the same shape."""
    ia = a.astype(np.float32).view(np.int32).astype(np.int64)
    ib = b.astype(np.float32).view(np.int32).astype(np.int64)
    # Map the sign-magnitude bit patterns onto a line so that adjacent floats differ by one.
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


@dataclass
class Drift:
    path: str
    message: str


def check(golden_dir: Path, cases: tuple[Case, ...] | None = None) -> tuple[list[Drift], int]:
    """Regenerate `cases` (default: every registry case) in memory and compare with the folder.

    The folder must hold those cases, each with the regenerated input sets (its other cases,
    with `cases`, are not compared); inputs must match bit for bit, outputs within one float32
    ulp.
    Returns the drifts and the number of output elements that differed by exactly one ulp
    (summation-order noise).
    """
    manifest = read_golden_manifest(golden_dir)
    cfg, seed = manifest_config(manifest), int(manifest["seed"])
    wanted = cases or registry.CASES
    drifts, one_ulp = [], 0  # (a case tconform does not have: refused with the manifest)
    folders = {p.name for p in golden_dir.iterdir() if p.is_dir()}
    for name in sorted(folders - set(manifest["cases"])):
        drifts.append(Drift(str(golden_dir / name), f"a folder {MANIFEST} does not list"))
    for case in wanted:
        name = case.name
        if name not in manifest["cases"]:
            drifts.append(Drift(str(golden_dir / name), "missing: the manifest has no such case"))
            continue
        stored = read_case(golden_dir, manifest, case, cfg)
        fresh = generate_case(case, cfg, seed)
        if [s.name for s in stored] != [s.name for s in fresh]:
            drifts.append(Drift(str(golden_dir / name), "input sets differ from a regeneration"))
            continue
        for old, new in zip(stored, fresh, strict=True):
            where = golden_dir / name / old.name
            for key, array in new.inputs.items():
                if not np.array_equal(old.inputs[key], array):
                    drifts.append(Drift(str(where), f"input {key!r} differs from a regeneration"))
            for key, array in new.outputs.items():
                if old.outputs[key].shape != array.shape:
                    shapes = f"{list(old.outputs[key].shape)} vs {list(array.shape)}"
                    drifts.append(Drift(str(where), f"output {key!r} shape differs: {shapes}"))
                    continue
                ulps = ulp_distance(old.outputs[key], array)
                if ulps.max(initial=0) > 1:
                    drifts.append(
                        Drift(str(where), f"output {key!r} differs by {int(ulps.max())} ulp")
                    )
                one_ulp += int((ulps == 1).sum())
    return drifts, one_ulp
