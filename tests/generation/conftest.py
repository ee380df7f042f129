"""Generation test fixtures: the committed generation goldens (the tiny preset's generation
models, exported once per session for both mask fills, are tests/conftest.py's
`generation_artifacts`: the worker tests run them too)."""

from __future__ import annotations

import pytest
from gen_helpers import GOLDEN_DIR, TINY

from tconform.generation import golden
from tconform.weights import DEFAULT_SEED


@pytest.fixture(scope="session")
def golden_cases():
    cfg, seed, checkpoint, cases = golden.read_cases(GOLDEN_DIR)
    assert cfg == TINY and seed == DEFAULT_SEED
    assert checkpoint == golden.checkpoint_record()
    return cases
