"""Helpers of the generation tests (fixtures are in conftest.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tconform.config import PRESETS
from tconform.generation.golden import golden_params

TINY = PRESETS["tiny"]
REPO = Path(__file__).resolve().parents[2]
GOLDEN_DIR = REPO / "golden-generation"


def params_of(cfg):
    """The weights the goldens are decoded with (the trained checkpoint's)."""
    return golden_params(cfg)


def decode_inputs(case):
    inputs = case.input_set.inputs
    return inputs["src_ids"], inputs["src_keep"], (inputs["prefix_ids"], inputs["prefix_keep"])


def quiet_nan():
    """A -inf fill makes fully masked rows NaN by design; numpy need not warn about them."""
    return np.errstate(invalid="ignore")


def open_generation_models(stack, runtime, cfg, folder: Path, steps: dict | None = None) -> dict:
    """The generation models of `runtime` for `cfg`'s files in `folder`, opened through the
    execution layer and closed with `stack` (`steps`: a case name -> a file replacing the
    folder's)."""
    from tconform.execution import Subject, case_module, open_subject
    from tconform.models import derived_file
    from tconform.registry import GENERATION_CASES

    params = params_of(cfg)
    opened = {}
    for case in GENERATION_CASES:
        path = Path((steps or {}).get(case.name, folder / case.name / "model.onnx"))
        subject = Subject(derived_file(path), case_module(case, cfg, params))
        opened[case.name] = stack.enter_context(open_subject(runtime, subject))
    return opened
