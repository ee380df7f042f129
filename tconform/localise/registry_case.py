"""Localisation of a shipped case's export (`verify --localise`): the case's module built with
tconform's parameters in float64 is the reference; the parameters are float32 values, so the
float64 copy holds exactly the exported weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tconform import registry
from tconform.compare import Tolerance, tolerance_for
from tconform.config import PRESETS, ModelConfig
from tconform.export import ExportSettings, build_module
from tconform.localise import Localisation, ModuleTree, capture_calls, localise
from tconform.models import ModelUnderTest, derived_file
from tconform.runtimes import Runtime, make_runtime
from tconform.weights import DEFAULT_SEED


def localise_case(
    case_name: str,
    model: ModelUnderTest | Path,
    inputs: dict[str, np.ndarray],
    cfg: ModelConfig | None = None,
    seed: int = DEFAULT_SEED,
    runtime: Runtime | None = None,
    tol: Tolerance | None = None,
    checkpoint: str = "",
    isolate_modules: str = "first",
) -> Localisation:
    """Localise a registry case's exported model (e.g. `transformer`) against its float64
    reference module (cfg: default the tiny preset). inputs: the case's inputs by name, as the
    model takes them (a golden input set, or registry.make_inputs). tol: default the case's
    float32 tolerance. checkpoint: the trained weights the model was exported with (instead
    of the seeded ones); isolate_modules: as `localise` takes it."""
    case = registry.get_case(case_name)
    cfg = cfg or PRESETS["tiny"]
    module, _ = build_module(case, ExportSettings(cfg, seed, checkpoint=checkpoint))
    module = module.double()
    specs = case.inputs(cfg)
    args = tuple(
        torch.tensor(np.asarray(inputs[s.name]), dtype=torch.float64)
        if s.kind == "float"
        else torch.tensor(np.asarray(inputs[s.name]))
        for s in specs
    )
    calls, _ = capture_calls(module, args, {})
    if isinstance(model, Path):
        model = derived_file(model)
    return localise(
        model,
        calls,
        ModuleTree.of(module),
        {s.name: np.asarray(inputs[s.name]) for s in specs},
        runtime or make_runtime("onnxruntime"),
        tol or tolerance_for("float32", case.tolerance),
        isolate_modules=isolate_modules,
    )
