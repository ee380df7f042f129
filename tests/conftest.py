"""Shared fixtures: tiny goldens and exported models, built once per test session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from shared_build import built_once

from tconform import doc, golden, registry
from tconform.config import PRESETS
from tconform.export import ExportJob, ExportSettings, export_jobs
from tconform.weights import DEFAULT_SEED

TINY = PRESETS["tiny"]


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> dict[str, Path]:
    """golden/ and artifacts/ (dynamo, float32) for every case of the tiny preset, with the
    document checks' models under artifacts/doc/, exported in one pool (a test's copy reuses
    them instead of exporting them again); built once per test run, shared by xdist's workers."""
    with built_once(tmp_path_factory, "built") as (root, to_build):
        artifacts = root / "artifacts"
        if to_build:
            golden.write(root / "golden", TINY, DEFAULT_SEED, registry.CASES, "tiny")
            cases = [ExportJob(case, ExportSettings(TINY), artifacts) for case in registry.CASES]
            export_jobs(cases + doc.required_exports(artifacts))
    return {"golden": root / "golden", "artifacts": artifacts}


@pytest.fixture
def workspace(tmp_path, built) -> dict[str, Path]:
    """A private copy of the built goldens and models, free to corrupt."""
    paths = {}
    for name, src in built.items():
        paths[name] = tmp_path / name
        shutil.copytree(src, paths[name])
    return paths


@pytest.fixture
def thread_flushes_subnormals():
    """Whether this thread's float arithmetic turns a subnormal into zero, judged on the bits
    (with the flags set, a comparison with a subnormal treats it as zero too). Restores
    PyTorch's default afterwards, so no later test inherits a flag set here."""
    import numpy as np
    import torch

    def flushes() -> bool:
        product = np.array([1e-40], np.float32) * np.float32(1)
        return int(product.view(np.uint32)[0]) == 0

    yield flushes
    torch.set_flush_denormal(False)


@pytest.fixture
def cli(capsys):
    """Run `tconform ARGS` in-process: cli(*args) -> (exit code, stdout, stderr). An exception
    other than SystemExit escapes and fails the test: the CLI must never show a traceback."""
    from tconform.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
        else:
            code = 0
        out, err = capsys.readouterr()
        return code, out, err

    return run


TIERS = ("unit", "integration", "zoo")


def pytest_collection_modifyitems(config, items):
    """Every test belongs to exactly one tier, so `pytest -m unit` is the fast suite and
    `pytest -m zoo` the real models (tests/zoo)."""
    untiered = [
        i.nodeid for i in items if sum(i.get_closest_marker(t) is not None for t in TIERS) != 1
    ]
    if untiered:
        raise pytest.UsageError(f"tests without exactly one of {TIERS} markers: {untiered[:5]}")


@pytest.fixture(scope="session")
def generation_artifacts(tmp_path_factory) -> Path:
    """<root>/generation (mask fill -inf) and <root>/generation-fill-1e9, exported once per
    test run (shared by xdist's workers), with the goldens' checkpoint weights."""
    from tconform.suites.generation import export_models

    with built_once(tmp_path_factory, "generation-artifacts") as (root, to_build):
        if to_build:
            tiny = PRESETS["tiny"]
            configs = [tiny, tiny.replace(mask_fill="-1e9")]
            export_models(configs, tiny, DEFAULT_SEED, root, lambda _: None)
    return root
