"""Generation test fixtures: the committed generation goldens and the tiny preset's generation
models, exported once per session for both mask fills."""

from __future__ import annotations

from pathlib import Path

import pytest
from gen_helpers import GOLDEN_DIR, TINY
from shared_build import built_once

from tconform.generation import golden
from tconform.suites.generation import export_models
from tconform.weights import DEFAULT_SEED


@pytest.fixture(scope="session")
def golden_cases():
    cfg, seed, checkpoint, cases = golden.read_cases(GOLDEN_DIR)
    assert cfg == TINY and seed == DEFAULT_SEED
    assert checkpoint == golden.checkpoint_record()
    return cases


@pytest.fixture(scope="session")
def generation_artifacts(tmp_path_factory) -> Path:
    """<root>/generation (mask fill -inf) and <root>/generation-fill-1e9, exported once per
    test run (shared by xdist's workers), with the goldens' checkpoint weights."""
    with built_once(tmp_path_factory, "generation-artifacts") as (root, to_build):
        if to_build:
            configs = [TINY, TINY.replace(mask_fill="-1e9")]
            export_models(configs, TINY, DEFAULT_SEED, root, lambda _: None)
    return root
