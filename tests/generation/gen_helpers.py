"""Helpers of the generation tests (fixtures are in conftest.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tconform.config import PRESETS
from tconform.reference import Transformer
from tconform.weights import DEFAULT_SEED, make_params

TINY = PRESETS["tiny"]
REPO = Path(__file__).resolve().parents[2]
GOLDEN_DIR = REPO / "golden-generation"


def params_of(cfg):
    return make_params(Transformer(cfg), DEFAULT_SEED)


def decode_inputs(case):
    inputs = case.input_set.inputs
    return inputs["src_ids"], inputs["src_keep"], (inputs["prefix_ids"], inputs["prefix_keep"])


def quiet_nan():
    """A -inf fill makes fully masked rows NaN by design; numpy need not warn about them."""
    return np.errstate(invalid="ignore")


def sessions_for(runtime, cfg, folder: Path, steps: dict | None = None) -> dict:
    """The generation sessions of `runtime` for `cfg`'s models in `folder` (`steps`: a case
    name -> model file that replaces the folder's)."""
    from tconform.generation.models import GENERATION_CASES
    from tconform.runtimes import Subject, open_subject

    params = params_of(cfg)
    sessions = {}
    for case in GENERATION_CASES:
        path = (steps or {}).get(case.name, folder / case.name / "model.onnx")
        subject = Subject(path, case.module_target(cfg, params))
        sessions[case.name] = open_subject(runtime, subject)
    return sessions
