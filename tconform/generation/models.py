"""The three models of incremental decoding, as registry cases, so that the export machinery
(cache keys, manifest, checker, workers) handles them like every other model.

They are not in registry.CASES: they have no per-component goldens; the generation goldens
(tconform.generation.golden) check them through whole decoded sequences instead.
"""

from __future__ import annotations

from pathlib import Path

from tconform.errors import UsageError
from tconform.export import ExportRecord, ExportSettings, export_cases
from tconform.oracle import incremental as oracle_incremental
from tconform.reference import incremental
from tconform.registry import SRC_IDS, SRC_KEEP, Case, TensorSpec, _fixed

CACHE_AXES = ("layers", "batch", "heads", "past_seq", "d_head")
CROSS_AXES = ("layers", "batch", "heads", "src_seq", "d_head")
LOG_PROBS = TensorSpec("log_probs", ("batch", "one", "tgt_vocab"))

ENCODER = Case(
    "gen_encoder",
    "encoder for generation: memory and every layer's cross-attention keys/values",
    incremental.EncoderModel,
    oracle_incremental.encode,
    _fixed(SRC_IDS, SRC_KEEP),
    _fixed(
        TensorSpec("memory", ("batch", "src_seq", "d_model")),
        TensorSpec("cross_k", CROSS_AXES),
        TensorSpec("cross_v", CROSS_AXES),
    ),
    "model",
)

STEP = Case(
    "gen_step",
    "decoder step with a key/value cache",
    incremental.DecoderStepModel,
    oracle_incremental.decoder_step,
    _fixed(
        TensorSpec("tgt_ids", ("batch", "one"), "tgt_ids"),
        TensorSpec("position", ("batch",), "position"),
        SRC_KEEP,
        TensorSpec("past_keep", ("batch", "past_seq"), "tgt_keep"),
        TensorSpec("new_keep", ("batch", "one"), "tgt_keep"),
        TensorSpec("past_k", CACHE_AXES),
        TensorSpec("past_v", CACHE_AXES),
        TensorSpec("cross_k", CROSS_AXES),
        TensorSpec("cross_v", CROSS_AXES),
    ),
    _fixed(
        LOG_PROBS,
        TensorSpec("present_k", ("layers", "batch", "heads", "tgt_seq", "d_head")),
        TensorSpec("present_v", ("layers", "batch", "heads", "tgt_seq", "d_head")),
    ),
    "model",
)

PREFIX = Case(
    "gen_prefix",
    "decoder without a cache: the whole prefix every step",
    incremental.PrefixDecoderModel,
    lambda p, cfg, *inputs: (oracle_incremental.prefix_decoder(p, cfg, *inputs),),
    _fixed(
        TensorSpec("tgt_ids", ("batch", "tgt_seq"), "tgt_ids"),
        TensorSpec("tgt_keep", ("batch", "tgt_seq"), "tgt_keep"),
        TensorSpec("memory", ("batch", "src_seq", "d_model")),
        SRC_KEEP,
    ),
    _fixed(LOG_PROBS),
    "model",
)

GENERATION_CASES: tuple[Case, ...] = (ENCODER, STEP, PREFIX)


def generation_case(name: str) -> Case:
    """The generation model called `name` (what `verify --generation --model NAME=PATH` takes)."""
    for case in GENERATION_CASES:
        if case.name == name:
            return case
    names = ", ".join(case.name for case in GENERATION_CASES)
    raise UsageError(f"unknown generation model {name!r}; choose from {names}")


def export_generation_models(
    settings: ExportSettings, out_dir: Path, on_done=None, force: bool = False
) -> dict[str, ExportRecord]:
    """Export (or reuse) the three models into out_dir; {case name: record}."""
    records = export_cases(GENERATION_CASES, settings, out_dir, on_done=on_done, force=force)
    return {record.case: record for record in records}
