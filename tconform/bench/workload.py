"""What one group of bench rows times: one case at one shape, the same inputs for every engine.

A workload is where a bench run's cases come from, seen from the timing loop (bench/run.py):
tconform's own registry cases at each BATCHxSEQ shape (bench/run.py), or a user's model at each
of its input sets (bench/module.py). Each engine of the run is opened on the workload's models
or module (bench/engines.py), timed on its inputs and judged against its float64 outputs
(bench/measure.py), whatever the workload's origin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache, partial

import numpy as np

from tconform import registry
from tconform.compare import OutputComparison
from tconform.config import ModelConfig
from tconform.execution import case_module
from tconform.models import ModelUnderTest
from tconform.registry import Case, Shape
from tconform.runtimes import ModuleTarget

Export = tuple[str, str]  # (attention kernel, dtype): which export a graph variant runs


@dataclass(frozen=True)
class Workload:
    """One case at one shape: `feeds` for every engine, the float64 `expected` outputs by name
    (computed on first need, once), the `models` a graph variant runs (by export) and the
    `module` the module runtimes run.

    `tolerance` is the case's size (a row class of tconform.compare.TOLERANCES). `batch` and
    `seq` are the shape's (None where a user's model has no such axis); `input_set` names a
    user's model's input set (None for a registry case, whose shape is BATCHxSEQ). `flop` is
    one forward pass's matrix-multiply FLOP (None: not counted); `config_weight_bytes` what the
    config says a pass reads of weights, where an engine holds nothing to count. A user's
    module runs as the user holds it: the module runtimes take `module_options` (its dtype and
    device) and run only on `module_ep` (None: on every provider). `cfg` is a registry case's
    preset (the optimizer-fused variant needs it; a user's model has no such variant), `preset`
    its name (its own tolerance rows, where measured: tconform.compare.PRESET_TOLERANCES)."""

    case: str
    tolerance: str
    batch: int | None
    seq: int | None
    feeds: Mapping[str, np.ndarray]
    expected: Callable[[], Mapping[str, np.ndarray]]
    module: ModuleTarget
    models: Mapping[Export, ModelUnderTest | None] = field(default_factory=dict)
    flop: int | None = None
    config_weight_bytes: Callable[[], int] | None = None
    input_set: str | None = None
    module_options: Mapping[str, object] = field(default_factory=dict)
    module_ep: str | None = None
    cfg: ModelConfig | None = None
    preset: str | None = None
    # a user's model: (outputs, precision) -> each output compared as check compares it (its
    # tolerance: the row's, or what --atol, --rtol and --tolerance set; its padding mask);
    # None: under the `tolerance` class's row
    judge: Callable[[Mapping[str, np.ndarray], str], list[OutputComparison]] | None = None

    @property
    def shape(self) -> str:
        """How rows name the shape: BATCHxSEQ, or a user's model's input set."""
        return self.input_set or f"{self.batch}x{self.seq}"

    @property
    def tokens(self) -> int | None:
        """Tokens in one forward pass (None where the model has no sequence axis)."""
        if self.batch is None or self.seq is None:
            return None
        return self.batch * self.seq

    def shape_fields(self) -> dict[str, object]:
        """How every row of the workload names its shape."""
        named = {"input_set": self.input_set} if self.input_set is not None else {}
        return {**named, "batch": self.batch, "seq": self.seq}


def case_workload(
    case: Case,
    cfg: ModelConfig,
    params: Mapping[str, np.ndarray],
    batch: int,
    seq: int,
    models: Mapping[Export, ModelUnderTest | None],
    preset: str | None = None,
) -> Workload:
    """A registry case at batch x seq (the sequence both source and target length): inputs
    drawn with seed 0, the oracle's outputs, the reference module with the export's weights."""
    shape = Shape(batch, seq, seq)
    feeds = registry.make_inputs(case, cfg, shape, np.random.default_rng(0))
    names = [spec.name for spec in case.outputs(cfg)]

    @cache
    def expected() -> dict[str, np.ndarray]:
        outputs = registry.run_oracle(case, cfg, params, feeds)
        return dict(zip(names, outputs, strict=True))

    return Workload(
        case.name,
        case.tolerance,
        batch,
        seq,
        feeds,
        expected,
        case_module(case, cfg, params),
        models,
        flop=case.flop_count(cfg, shape),
        config_weight_bytes=partial(case.weight_bytes_read, cfg, shape),
        cfg=cfg,
        preset=preset,
    )
