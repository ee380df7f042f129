"""The model under test: the exact ONNX file a result ran, where it came from, and whether it can
stand in for a case at all.

A model is either tconform's own (exported in this run, or cached: recorded in the artifacts
manifest with unchanged bytes) or given (`verify --model CASE=PATH`, or a file in an artifacts
folder that tconform did not write). A given file is only ever read: tconform never exports over
it, rewrites it or deletes it. Before anything runs, a given file must be a regular file of a
sane size, parse as ONNX, keep its external data inside its own folder, and match the case's
goldens in input and output names, element types and ranks.

`model_from_record` and `held_model` say which of the two an artifacts folder's file is.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import onnx
from onnx import TensorProto

from tconform.config import ModelConfig
from tconform.errors import UsageError
from tconform.export import ExportRecord
from tconform.files import (
    require_inside,
    require_name_fits,
    require_unchanged,
    require_utf8_name,
    resolved,
    sha256_file,
)
from tconform.heap import trim
from tconform.provenance import ModelProvenance, onnx_provenance
from tconform.registry import Case, exporting_command, get_case

# A protobuf message cannot exceed 2 GiB, so a larger .onnx file cannot be a model (weights past
# that size live in external data files).
MAX_MODEL_BYTES = 2**31

# Element types a case's tensors may have, by TensorSpec kind ("float" may be float32, float16
# or bfloat16: the model's own type decides its tolerance row).
_FLOAT_TYPES = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.BFLOAT16: "bfloat16",
}
_KIND_TYPES = {
    "src_ids": TensorProto.INT64,
    "tgt_ids": TensorProto.INT64,
    "src_keep": TensorProto.BOOL,
    "tgt_keep": TensorProto.BOOL,
    "attn_mask": TensorProto.BOOL,
    "position": TensorProto.INT64,
}


@dataclass(frozen=True)
class ModelUnderTest:
    """A model file (one case's, or a user's module's: case None) and its provenance;
    `precision` is the float type it computes in."""

    case: Case | None
    path: Path
    provenance: ModelProvenance
    notes: tuple[str, ...] = ()
    # the way on for a dimension its export left static where one was asked free ('': the
    # option that frees it); an exporter that could not keep it free says which may
    fixed_way_on: str = ""

    @property
    def io_type(self) -> str:
        """The float type its inputs and outputs have (what it is fed)."""
        return self.provenance.elem_type or "float32"

    @property
    def precision(self) -> str:
        """Its tolerance row (tconform.provenance.ModelProvenance.precision)."""
        return self.provenance.precision

    def confirm_unchanged(self) -> None:
        """The bytes that ran are the bytes hashed: re-hash after a session has read the file
        (and its external data), so a file replaced mid-run cannot borrow another's pass."""
        now = {loc: sha256_file(self.path.parent / loc) for loc in self.provenance.external_data}
        if sha256_file(self.path) != self.provenance.sha256 or now != self.provenance.external_data:
            raise UsageError(f"{self.path}: changed while it was being verified")


def parse_model_options(
    items: tuple[str, ...] | list[str], lookup: Callable[[str], Case] = get_case
) -> dict[str, Path]:
    """['transformer=opt.onnx'] -> {'transformer': Path('opt.onnx')}; one line per bad item.
    `lookup` knows the case names (the registry's; the generation models' for --generation)."""
    models: dict[str, Path] = {}
    for item in items:
        case_name, sep, path = item.partition("=")
        case_name, path = case_name.strip(), path.strip()
        if not sep or not case_name or not path:
            raise UsageError(f"--model {item!r}: expected CASE=PATH (e.g. transformer=model.onnx)")
        lookup(case_name)  # an unknown case is a usage error listing the known ones
        if case_name in models:
            raise UsageError(f"--model: case {case_name!r} given twice")
        models[case_name] = require_name_fits(Path(path), room=0)  # read, never written beside
    return models


def given_model(case: Case, cfg: ModelConfig, path: Path, origin: str = "given") -> ModelUnderTest:
    """A file tconform did not write, checked to be a model that can stand in for `case`."""
    model = load_checked(path)
    check_signature(model, case, cfg, path)
    return _hashed(path, model, origin, case)


def given_file(path: Path, origin: str = "given") -> ModelUnderTest:
    """Any ONNX file, checked to be a readable model (a regular file first: a FIFO or a device
    is refused before it is opened), then hashed with its external data."""
    return _hashed(path, load_checked(path), origin)


def derived_file(path: Path, model: onnx.ModelProto | None = None) -> ModelUnderTest:
    """A file tconform wrote from the model under test (localisation's boundary copy, a cut
    subgraph, an injected fault): hashed and described, not checked as a user's file would be
    (a boundary copy's extra outputs carry no shapes, which ONNX's checker refuses)."""
    return _hashed(path, model if model is not None else read_graph(path), "derived")


def _hashed(
    path: Path, model: onnx.ModelProto, origin: str, case: Case | None = None
) -> ModelUnderTest:
    require_unchanged(path)  # in a folder this run locked, still that folder: its own bytes
    provenance = onnx_provenance(path, origin, sha256_file(path), model)
    digests = external_digests(model, path)
    # a file made elsewhere is freed where it was made; tconform's exports by an option
    way_on = "export the file again with that axis dynamic" if origin == "given" else ""
    return ModelUnderTest(
        case, path, replace(provenance, external_data=digests), fixed_way_on=way_on
    )


def load_checked(path: Path) -> onnx.ModelProto:
    """The ONNX model at `path` without its weights (`read_graph`), or one line saying why
    not."""
    require_utf8_name(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    if path.is_dir():
        raise UsageError(f"{path}: is a folder, not an ONNX file")
    if not path.is_file():
        raise UsageError(f"{path}: not a regular file (a device, pipe or socket)")
    size = path.stat().st_size
    if size == 0:
        raise UsageError(f"{path}: empty file, not an ONNX model")
    if size > MAX_MODEL_BYTES:
        raise UsageError(f"{path}: {size} bytes, larger than any ONNX protobuf can be (2 GiB)")
    try:
        model = read_graph(path)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise UsageError(f"{path}: not an ONNX model ({type(exc).__name__})") from None
    if not model.graph.node and not model.graph.output:
        raise UsageError(f"{path}: not an ONNX model (no graph)")
    check_external_data(model, path)  # before the checker, which reads external data
    try:
        onnx.checker.check_model(str(path))  # external data found beside the file, not in cwd
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"{path}: invalid ONNX model: {first}") from None
    newest = onnx.defs.onnx_opset_version()
    stamped = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if stamped and max(stamped) > newest:  # the checker lets it by; every runtime refuses it
        raise UsageError(
            f"{path}: stamped with ONNX opset {max(stamped)}, beyond the newest this onnx "
            f"{onnx.__version__} knows ({newest})"
        )
    return model


# Initializers larger than this are weights: what a reader of names, types and shapes leaves
# out (small ones stay: a Reshape's shape, a Constant folded into an initializer).
WEIGHT_BYTES = 4096


def read_graph(path: Path) -> onnx.ModelProto:
    """The ONNX model at `path` without its weights (external data is not read, embedded data
    of large initializers dropped; names, types and dims kept): what a reader of the graph
    needs. A model of hundreds of MB kept for its graph costs a few KB: the weights are dropped
    and the rest parsed into a message of its own, since protobuf frees a message's memory
    only with the whole message, never a field of it."""
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        if len(tensor.raw_data) > WEIGHT_BYTES:
            tensor.ClearField("raw_data")
    compact = onnx.ModelProto.FromString(model.SerializeToString())
    del model
    trim()
    return compact


def _external_tensors(model: onnx.ModelProto) -> list[TensorProto]:
    from onnx.external_data_helper import _get_all_tensors  # walks subgraphs too

    return [t for t in _get_all_tensors(model) if t.data_location == TensorProto.EXTERNAL]


def check_external_data(model: onnx.ModelProto, path: Path) -> None:
    """Every external data file must be a regular file inside the model's own folder, and hold
    the bytes its tensors claim."""
    folder = resolved(path.parent)
    for tensor in _external_tensors(model):
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if "\0" in location:  # no file can have such a name; Path would raise naming nothing
            raise UsageError(
                f"{path}: tensor {tensor.name!r} keeps its data at {location!r}, a name holding "
                "a NUL byte"
            )
        target = resolved(folder / location)
        if not location or os.path.isabs(location) or ".." in Path(location).parts:
            raise UsageError(
                f"{path}: tensor {tensor.name!r} keeps its data at {location!r}, "
                "outside the model's folder"
            )
        if not target.is_relative_to(folder):
            raise UsageError(
                f"{path}: tensor {tensor.name!r} keeps its data at {location!r}, which "
                "resolves outside the model's folder"
            )
        if not target.is_file():
            raise UsageError(f"{path}: external data {location!r} missing or not a regular file")
        offset, size = _byte_count(info, "offset", path, tensor), target.stat().st_size
        end = offset + _byte_count(info, "length", path, tensor)
        if end > size:
            raise UsageError(f"{path}: external data {location!r} is shorter than its tensors")
        # Without a length, a reader takes the rest of the file: it must be this tensor's size
        # (a huge file would otherwise be read whole, and memory run out naming nothing).
        reads = _byte_count(info, "length", path, tensor) if "length" in info else size - offset
        needs = _tensor_bytes(tensor)
        if needs is not None and reads != needs:
            raise UsageError(
                f"{path}: tensor {tensor.name!r} reads {reads} bytes of external data "
                f"{location!r}, but its type and shape hold {needs}"
            )


def _byte_count(info: dict[str, str], key: str, path: Path, tensor: TensorProto) -> int:
    """An external data entry's offset or length: a whole number of bytes, 0 where absent."""
    text = info.get(key, "0")
    if not text.isdigit() or not text.isascii():  # neither a sign nor other digits
        raise UsageError(
            f"{path}: tensor {tensor.name!r} gives its external data {key} as {text!r}, not a "
            "whole number of bytes"
        )
    return int(text)


SUB_BYTE_TYPES = {  # packed two or four to a byte: no whole number of bytes per element
    getattr(TensorProto, name)
    for name in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(TensorProto, name)
}


def _tensor_bytes(tensor: onnx.TensorProto) -> int | None:
    """How many bytes the tensor's type and shape hold (None for strings, stored by length, and
    for types packed below a byte, such as int4)."""
    if tensor.data_type in SUB_BYTE_TYPES:
        return None
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    return None if dtype.kind in "OSU" else math.prod(tensor.dims) * dtype.itemsize


def external_digests(model: onnx.ModelProto, path: Path) -> dict[str, str]:
    """sha256 of every external data file, by location: part of the bytes that run."""
    locations = sorted(
        {e.value for t in _external_tensors(model) for e in t.external_data if e.key == "location"}
    )
    return {loc: sha256_file(path.parent / loc) for loc in locations}


def _value_infos(values) -> dict[str, tuple[int, int | None]]:
    """{name: (element type, rank or None)} of graph inputs or outputs."""
    found = {}
    for value in values:
        tensor = value.type.tensor_type
        rank = len(tensor.shape.dim) if tensor.HasField("shape") else None
        found[value.name] = (tensor.elem_type, rank)
    return found


def check_signature(model: onnx.ModelProto, case: Case, cfg: ModelConfig, path: Path) -> None:
    """Input and output names, element types and ranks must be those of the case's goldens;
    the first difference is the error. Float tensors may be float32, float16 or bfloat16, all
    alike."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = _value_infos(v for v in model.graph.input if v.name not in initializers)
    outputs = _value_infos(model.graph.output)
    float_types: set[int] = set()
    for role, specs, found in (
        ("input", case.inputs(cfg), inputs),
        ("output", case.outputs(cfg), outputs),
    ):
        wanted = [s.name for s in specs]
        if set(found) != set(wanted):
            extra = sorted(set(found) - set(wanted))
            missing = [n for n in wanted if n not in found]
            what = (
                f"has no {role} {missing[0]!r}" if missing else f"has an extra {role} {extra[0]!r}"
            )
            raise UsageError(f"{path}: {what}; case {case.name!r} has {role}s {', '.join(wanted)}")
        for spec in specs:
            elem_type, rank = found[spec.name]
            if spec.kind == "float":
                if elem_type not in _FLOAT_TYPES:
                    raise UsageError(
                        f"{path}: {role} {spec.name!r} has element type "
                        f"{TensorProto.DataType.Name(elem_type)}; case {case.name!r} needs "
                        "float32, float16 or bfloat16"
                    )
                float_types.add(elem_type)
            elif elem_type != _KIND_TYPES[spec.kind]:
                raise UsageError(
                    f"{path}: {role} {spec.name!r} has element type "
                    f"{TensorProto.DataType.Name(elem_type)}; case {case.name!r} needs "
                    f"{TensorProto.DataType.Name(_KIND_TYPES[spec.kind])}"
                )
            if rank != len(spec.axes):
                raise UsageError(
                    f"{path}: {role} {spec.name!r} has rank {rank}; case {case.name!r} needs "
                    f"{len(spec.axes)} ({', '.join(spec.axes)})"
                )
    if len(float_types) > 1:
        raise UsageError(f"{path}: mixes float types in its inputs/outputs")


def model_from_record(case: Case, record: ExportRecord, note: str = "") -> ModelUnderTest:
    """tconform's own export, described by its file as a given model is: the manifest names the
    bytes (their sha256, checked before they are reused) but never decides what they compute
    in, so an edited manifest cannot buy a model a looser row."""
    path = Path(record.location)
    origin = "cached" if record.cached else "exported"
    try:
        graph = read_graph(path)
    except Exception as exc:  # protobuf's DecodeError: bytes the manifest's sha256 was made to fit
        raise UsageError(
            f"{path}: cannot load it: not an ONNX model ({type(exc).__name__})"
        ) from None
    provenance = onnx_provenance(path, origin, record.sha256, graph)
    notes = (note,) if note else ()
    if record.attention_nodes:  # the variant is part of what was checked
        notes += (f"{record.attention} attention: {record.attention_nodes} ONNX Attention nodes",)
    return ModelUnderTest(case, path, provenance, notes)


def held_model(
    case: Case, cfg: ModelConfig, artifacts_dir: Path, manifest: dict, key: str
) -> ModelUnderTest:
    """--no-export: the case's file in the artifacts folder, as it is. tconform's own unchanged
    file is `cached`; anything else is checked like a given model."""
    path = artifacts_dir / case.name / "model.onnx"
    if not path.exists():
        raise UsageError(
            f"{path}: missing (--no-export exports nothing; run `{exporting_command(case.name)}`)"
        )
    require_inside(artifacts_dir, path)
    entry = manifest.get("models", {}).get(case.name)
    if entry is None:
        return given_model(case, cfg, path)
    if not path.is_file() or sha256_file(path) != entry.get("sha256"):
        model = given_model(case, cfg, path)
        return ModelUnderTest(
            case, path, model.provenance, ("changed since tconform wrote it: verified as given",)
        )
    record = ExportRecord.from_manifest(entry, artifacts_dir)
    stale = entry.get("key") != key
    note = "exported by another version of tconform or its libraries (cache key differs)"
    return model_from_record(case, record, note if stale else "")
