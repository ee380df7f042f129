"""Validation of manifests at the edge: every field tconform later uses is checked for type and
range once, where the manifest is read, so a malformed manifest is one line naming the file and
the field (exit 2), never a TypeError deep inside a run or a "conformance failure".

This module holds the checks of single values and the golden manifest's check; the artifacts
manifest's check (`check_artifacts_manifest`) uses them beside its reader, in tconform.export.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from tconform.config import MAX_SEED, PRESETS, ModelConfig, beyond_presets
from tconform.errors import UsageError
from tconform.files import SHA256_DIGEST as SHA256
from tconform.registry import case_names

SET_NAME = re.compile(r"test_data_set_\d+")
TENSOR_FILE = re.compile(r"(test_data_set_\d+)/(input|output)_\d+\.pb")


def fail(path: Path, where: str, what: str) -> UsageError:
    return UsageError(f"{path}: {where} {what}")


def expect_object(value, path: Path, where: str) -> dict:
    if not isinstance(value, dict):
        raise fail(path, where, f"must be an object, not {type(value).__name__}")
    return value


def expect_int(value, path: Path, where: str, low: int = 0, high: int | None = None) -> int:
    if type(value) is not int or value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise fail(path, where, f"must be an integer {bound}, not {value!r}")
    return value


def expect_str(value, path: Path, where: str, pattern: re.Pattern | None = None) -> str:
    if not isinstance(value, str) or (pattern is not None and not pattern.fullmatch(value)):
        raise fail(path, where, f"is not valid: {value!r}")
    return value


def expect_names(value, path: Path, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail(path, where, "must be a list of names")
    return value


def one_of(value, allowed) -> bool:
    return isinstance(value, str) and value in allowed


def config_of(data: dict, path: Path) -> ModelConfig:
    """A manifest's config, its fields checked and its sizes within the presets'."""
    given = expect_object(data.get("config"), path, "'config'")  # names the file itself
    try:
        cfg = ModelConfig.from_dict(given)
    except UsageError as exc:  # a field's own error: the file is named here
        raise UsageError(f"{path}: {exc}") from None
    too_large = beyond_presets(cfg)
    if too_large:
        raise fail(path, "'config'", too_large)
    return cfg


def check_header(data: dict, path: Path, cfg: ModelConfig) -> None:
    """The fields every golden manifest shares beside its config: the preset it names (whose
    config it must be), the seed, and the float32 the tensors are stored in."""
    preset = data.get("preset")
    if preset is not None and not (one_of(preset, PRESETS) and PRESETS[preset] == cfg):
        raise fail(path, "'preset'", f"{preset!r:.80} is not a preset whose config is 'config'")
    expect_int(data.get("seed"), path, "'seed'", 0, MAX_SEED)
    if data.get("stored_dtype", "float32") != "float32":
        raise fail(path, "'stored_dtype'", "must be float32 (goldens are stored in float32)")


def check_golden_manifest(data: dict, path: Path) -> None:
    """The golden manifest: config, seed and, per case, sets of tensor shapes and a sha256 for
    every tensor file (listed under a valid set name, never a path of its own)."""
    cfg = config_of(data, path)
    check_header(data, path, cfg)
    # Written for the reader, not used in a run; still, a manifest is well formed or refused.
    tolerances = expect_object(data.get("tolerances", {}), path, "'tolerances'")
    for row, limits in tolerances.items():
        limits = expect_object(limits, path, f"tolerance {row!r}")
        # Not capped at 1: the int4 model row's element bound is 2.5 (docs/tolerances.md).
        if not all(
            type(limits.get(k)) in (int, float) and 0 <= limits[k] < math.inf  # no bool
            for k in ("atol", "rtol")
        ):
            raise fail(path, f"tolerance {row!r}", "needs finite atol and rtol >= 0")
    if not isinstance(data.get("input_sets", []), list):
        raise fail(path, "'input_sets'", "must be a list")
    cases = expect_object(data.get("cases"), path, "'cases'")
    for name, entry in cases.items():
        where = f"case {name!r}"
        if name not in case_names():
            raise fail(path, where, "is not a case this tconform knows")
        entry = expect_object(entry, path, where)
        for field in ("inputs", "outputs"):
            if field in entry:
                expect_names(entry[field], path, f"{where} {field!r}")
        sets = expect_object(entry.get("sets"), path, f"{where} 'sets'")
        for set_name, shapes in sets.items():
            expect_str(set_name, path, f"{where} set name", SET_NAME)
            for tensor, shape in expect_object(shapes, path, f"{where} {set_name}").items():
                if not isinstance(shape, list):
                    raise fail(path, f"{where} {set_name} {tensor!r}", "shape must be a list")
                for size in shape:
                    expect_int(size, path, f"{where} {set_name} {tensor!r} size", 0, 2**31)
        hashes = expect_object(entry.get("sha256"), path, f"{where} 'sha256'")
        for rel, digest in hashes.items():
            expect_str(rel, path, f"{where} file name", TENSOR_FILE)
            expect_str(digest, path, f"{where} sha256 of {rel}", SHA256)
            if TENSOR_FILE.fullmatch(rel).group(1) not in sets:
                raise fail(path, f"{where} {rel!r}", "belongs to no listed set")
