"""Run each stated property (properties.py) on the float64 oracle and every requested runtime.

The components come from the registry at the tiny preset, exported into
artifacts/doc/tiny/; inputs are drawn from a fixed seed here (the tests draw them with
hypothesis). A provider that cannot run reports `unavailable`, never a pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tconform import registry
from tconform.config import PRESETS
from tconform.doc import properties
from tconform.doc.run import OpenedComponents
from tconform.errors import TconformError, WorkerCrashed
from tconform.execution import NotRun
from tconform.provenance import ModelProvenance

PROPERTY_CONFIG = PRESETS["tiny"]
PROPERTY_CONFIG_NAME = "tiny"
SEED = 0


@dataclass
class PropertyOutcome:
    id: str
    statement: str
    runtime: str
    status: str  # pass | fail | unavailable | error
    violation: float | None = None
    limit: float | None = None
    message: str = ""
    models: list[ModelProvenance] = field(default_factory=list)  # what ran (none: the oracle)

    def to_dict(self) -> dict[str, object]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data["models"] = [m.to_dict() for m in self.models]
        return data


def _zeros(seq: int) -> dict[str, np.ndarray]:
    return {"x": np.zeros((1, seq, PROPERTY_CONFIG.d_model), dtype=np.float32)}


def pe_table(components: OpenedComponents, runtime: str) -> np.ndarray:
    """The whole PE table as the runtime computes it: the component applied to zeros."""
    feeds = _zeros(PROPERTY_CONFIG.max_seq_len)
    return components.outputs(
        runtime, "positional_encoding", PROPERTY_CONFIG, PROPERTY_CONFIG_NAME, feeds
    )[0][0]


def draw_inputs(case_name: str, batch: int, src: int, tgt: int, seed: int = SEED) -> dict:
    """The registry's example inputs for `case_name` at this shape, from `seed`."""
    case = registry.get_case(case_name)
    rng = np.random.default_rng(seed)
    return registry.make_inputs(case, PROPERTY_CONFIG, registry.Shape(batch, src, tgt), rng)


def run_component(
    components: OpenedComponents, runtime: str, case_name: str, feeds: dict
) -> list[np.ndarray]:
    """The outputs of a property-config component on `runtime`."""
    return components.outputs(runtime, case_name, PROPERTY_CONFIG, PROPERTY_CONFIG_NAME, feeds)


def transformer_run(
    components: OpenedComponents, runtime: str, src_ids: np.ndarray
) -> properties.Run:
    """tgt_ids -> the whole model's logits for fixed src_ids, with no padding anywhere."""
    src_keep = np.ones(src_ids.shape, dtype=bool)

    def run(tgt_ids: np.ndarray) -> np.ndarray:
        feeds = {
            "src_ids": src_ids,
            "src_keep": src_keep,
            "tgt_ids": tgt_ids,
            "tgt_keep": np.ones(tgt_ids.shape, dtype=bool),
        }
        return np.asarray(
            run_component(components, runtime, "transformer", feeds)[0], dtype=np.float64
        )

    return run


def _pe_shift(components, runtime):
    return properties.pe_shift_violation(
        pe_table(components, runtime).astype(np.float64), PROPERTY_CONFIG.pe_base
    )


def _pe_wavelengths(components, runtime):
    return properties.pe_wavelength_violation(
        pe_table(components, runtime).astype(np.float64), PROPERTY_CONFIG.pe_base
    )


def _softmax_rows(components, runtime):
    feeds = draw_inputs("attention", 2, 5, 4)
    return properties.softmax_row_violation(
        run_component(components, runtime, "attention", feeds)[1].astype(np.float64)
    )


def _causal(components, runtime):
    rng = np.random.default_rng(SEED)
    src = rng.integers(0, PROPERTY_CONFIG.src_vocab, (2, 5))
    tgt = rng.integers(0, PROPERTY_CONFIG.tgt_vocab, (2, 6))
    return properties.causal_violation(
        transformer_run(components, runtime, src), tgt, PROPERTY_CONFIG.tgt_vocab
    )


def _multi_head(components, runtime):
    feeds = draw_inputs("mha_self", 2, 5, 5)
    params = components.params("mha_self", PROPERTY_CONFIG)
    out = run_component(components, runtime, "mha_self", feeds)[0]
    return properties.multi_head_violation(
        out, params, PROPERTY_CONFIG, feeds["x"], feeds["src_keep"]
    )


def _shapes(components, runtime):
    worst = 0.0
    for batch, seq in ((1, 3), (2, 7)):
        for case_name, name in (("encoder_layer", "x"), ("decoder_layer", "y")):
            feeds = draw_inputs(case_name, batch, seq, seq)
            out = run_component(components, runtime, case_name, feeds)[0]
            worst = max(worst, properties.shape_violation(out, feeds[name].shape))
    return worst


@dataclass(frozen=True)
class Measurement:
    id: str
    statement: str
    cases: tuple[str, ...]  # the registry cases it runs, exported at PROPERTY_CONFIG
    measure: Callable[[OpenedComponents, str], float]  # (components, runtime) -> worst violation


MEASUREMENTS: tuple[Measurement, ...] = (
    Measurement(
        "pe-shift-rotation",
        "PE(pos+k) is a fixed rotation of PE(pos) for every k",
        ("positional_encoding",),
        _pe_shift,
    ),
    Measurement(
        "pe-wavelengths",
        "PE wavelengths: geometric from 2π towards base·2π",
        ("positional_encoding",),
        _pe_wavelengths,
    ),
    Measurement("softmax-rows", "attention weight rows sum to 1", ("attention",), _softmax_rows),
    Measurement(
        "causal-mask",
        "target tokens after t leave outputs at <= t unchanged",
        ("transformer",),
        _causal,
    ),
    Measurement(
        "multi-head-concat",
        "MultiHead = Concat(head_1..head_h) W^O",
        ("mha_self",),
        _multi_head,
    ),
    Measurement(
        "shape-preserved",
        "encoder and decoder layers keep (B, S, d_model)",
        ("encoder_layer", "decoder_layer"),
        _shapes,
    ),
)


def property_outcomes(components: OpenedComponents, runtimes: list[str]) -> list[PropertyOutcome]:
    """Every property on the oracle and each runtime."""
    outcomes = []
    for m in MEASUREMENTS:
        for runtime in ["oracle", *runtimes]:
            precision = components.precision(runtime)
            limit = properties.LIMITS.get(precision)
            if limit is None:  # int8, bfloat16: no property limit is calibrated for them
                why = f"no limit for {precision} results (tconform.doc.properties.LIMITS)"
                outcomes.append(PropertyOutcome(m.id, m.statement, runtime, "skip", message=why))
                continue
            try:
                violation = m.measure(components, runtime)
            except NotRun as why:  # unavailable, or skip (a kernel missing)
                outcomes.append(
                    PropertyOutcome(m.id, m.statement, runtime, str(why.status), message=str(why))
                )
                continue
            except TconformError as exc:
                outcomes.append(
                    PropertyOutcome(m.id, m.statement, runtime, "error", message=str(exc))
                )
                continue
            except WorkerCrashed as exc:  # the runtime's worker died: its verdict
                outcomes.append(
                    PropertyOutcome(m.id, m.statement, runtime, "crash", message=str(exc))
                )
                continue
            status = "pass" if violation <= limit else "fail"
            models = [
                components.provenance(runtime, name, PROPERTY_CONFIG, PROPERTY_CONFIG_NAME)
                for name in m.cases
            ]
            outcomes.append(
                PropertyOutcome(
                    m.id,
                    m.statement,
                    runtime,
                    status,
                    violation,
                    limit,
                    models=[model for model in models if model],
                )
            )
    return outcomes
