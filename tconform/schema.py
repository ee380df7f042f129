"""Validation of the two manifests at the edge: every field tconform later uses is checked for
type and range here, once, so a malformed manifest is one line naming the file and the field
(exit 2), never a TypeError deep inside a run or a "conformance failure".
"""

from __future__ import annotations

import re
from pathlib import Path

from tconform.config import ATTENTION_KERNELS, MAX_SEED, ModelConfig
from tconform.errors import UsageError

SHA256 = re.compile(r"[0-9a-f]{64}")
SET_NAME = re.compile(r"test_data_set_\d+")
TENSOR_FILE = re.compile(r"(test_data_set_\d+)/(input|output)_\d+\.pb")


def _fail(path: Path, where: str, what: str) -> UsageError:
    return UsageError(f"{path}: {where} {what}")


def expect_object(value, path: Path, where: str) -> dict:
    if not isinstance(value, dict):
        raise _fail(path, where, f"must be an object, not {type(value).__name__}")
    return value


def expect_int(value, path: Path, where: str, low: int = 0, high: int | None = None) -> int:
    if type(value) is not int or value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise _fail(path, where, f"must be an integer {bound}, not {value!r}")
    return value


def expect_str(value, path: Path, where: str, pattern: re.Pattern | None = None) -> str:
    if not isinstance(value, str) or (pattern is not None and not pattern.fullmatch(value)):
        raise _fail(path, where, f"is not valid: {value!r}")
    return value


def expect_names(value, path: Path, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, where, "must be a list of names")
    return value


def _one_of(value, allowed) -> bool:
    return isinstance(value, str) and value in allowed


def config_of(data: dict, path: Path) -> ModelConfig:
    try:
        return ModelConfig.from_dict(expect_object(data.get("config"), path, "'config'"))
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None


def check_golden_manifest(data: dict, path: Path) -> None:
    """The golden manifest: config, seed and, per case, sets of tensor shapes and a sha256 for
    every tensor file (listed under a valid set name, never a path of its own)."""
    from tconform.registry import case_names

    config_of(data, path)
    expect_int(data.get("seed"), path, "'seed'", 0, MAX_SEED)
    # Written for the reader, not used in a run; still, a manifest is well formed or refused.
    tolerances = expect_object(data.get("tolerances", {}), path, "'tolerances'")
    for row, limits in tolerances.items():
        limits = expect_object(limits, path, f"tolerance {row!r}")
        if not all(
            isinstance(limits.get(k), int | float) and 0 <= limits[k] <= 1 for k in ("atol", "rtol")
        ):
            raise _fail(path, f"tolerance {row!r}", "needs atol and rtol between 0 and 1")
    if not isinstance(data.get("preset", ""), str):
        raise _fail(path, "'preset'", "must be a preset's name")
    if not isinstance(data.get("input_sets", []), list):
        raise _fail(path, "'input_sets'", "must be a list")
    if data.get("stored_dtype", "float32") != "float32":
        raise _fail(path, "'stored_dtype'", "must be float32 (goldens are stored in float32)")
    cases = expect_object(data.get("cases"), path, "'cases'")
    for name, entry in cases.items():
        where = f"case {name!r}"
        if name not in case_names():
            raise _fail(path, where, "is not a case this tconform knows")
        entry = expect_object(entry, path, where)
        for field in ("inputs", "outputs"):
            if field in entry:
                expect_names(entry[field], path, f"{where} {field!r}")
        sets = expect_object(entry.get("sets"), path, f"{where} 'sets'")
        for set_name, shapes in sets.items():
            expect_str(set_name, path, f"{where} set name", SET_NAME)
            for tensor, shape in expect_object(shapes, path, f"{where} {set_name}").items():
                if not isinstance(shape, list):
                    raise _fail(path, f"{where} {set_name} {tensor!r}", "shape must be a list")
                for size in shape:
                    expect_int(size, path, f"{where} {set_name} {tensor!r} size", 0, 2**31)
        hashes = expect_object(entry.get("sha256"), path, f"{where} 'sha256'")
        for rel, digest in hashes.items():
            expect_str(rel, path, f"{where} file name", TENSOR_FILE)
            expect_str(digest, path, f"{where} sha256 of {rel}", SHA256)
            if TENSOR_FILE.fullmatch(rel).group(1) not in sets:
                raise _fail(path, f"{where} {rel!r}", "belongs to no listed set")


def check_artifacts_manifest(data: dict, path: Path) -> None:
    """The artifacts manifest: per model its file (always CASE/model.onnx), sha256 and settings."""
    from tconform.export import DTYPES, EXPORTERS
    from tconform.generation.models import GENERATION_CASES
    from tconform.registry import case_names

    known = (*case_names(), *(case.name for case in GENERATION_CASES))

    models = expect_object(data.get("models", {}), path, "'models'")
    if "exporter" in data and not _one_of(data["exporter"], EXPORTERS):
        raise _fail(path, "'exporter'", f"is not one of {', '.join(EXPORTERS)}")
    if "dtype" in data and not _one_of(data["dtype"], DTYPES):
        raise _fail(path, "'dtype'", f"is not one of {', '.join(DTYPES)}")
    if "opset" in data:
        expect_int(data["opset"], path, "'opset'", 1, 100)
    if "attention" in data and not _one_of(data["attention"], ATTENTION_KERNELS):
        raise _fail(path, "'attention'", f"is not one of {', '.join(ATTENTION_KERNELS)}")
    for name, entry in models.items():
        where = f"model {name!r}"
        if name not in known:
            raise _fail(path, where, "is not a case this tconform knows")
        entry = expect_object(entry, path, where)
        if entry.get("path") != f"{name}/model.onnx":
            raise _fail(path, f"{where} 'path'", f"must be {name}/model.onnx")
        expect_str(entry.get("sha256"), path, f"{where} 'sha256'", SHA256)
        expect_str(entry.get("key"), path, f"{where} 'key'", SHA256)
        if not _one_of(entry.get("exporter"), EXPORTERS) or not _one_of(entry.get("dtype"), DTYPES):
            raise _fail(path, where, "has an unknown exporter or dtype")
        expect_int(entry.get("opset"), path, f"{where} 'opset'", 1, 100)
        expect_int(entry.get("ir_version"), path, f"{where} 'ir_version'", 1, 100)
        expect_names(entry.get("inputs"), path, f"{where} 'inputs'")
        expect_names(entry.get("outputs"), path, f"{where} 'outputs'")
