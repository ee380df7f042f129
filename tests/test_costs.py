"""Each case's FLOP count (its formula in tconform/costs.py) and weight bytes, checked against
independent counts: torch's FlopCounterMode on the reference modules run on real tensors, and
the modules' own parameters."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tconform import registry
from tconform.config import PRESETS
from tconform.registry import Shape

pytestmark = pytest.mark.unit

# Distinct batch, source and target sizes so that a swapped axis changes the count.
BATCH, SRC, TGT = 2, 7, 5
PRESET_NAMES = ("tiny", "tiny-doc001", "tiny-doc002")


def counted_flops(case: registry.Case, cfg) -> int:
    """Matrix-multiply FLOP that torch itself counts for one forward pass."""
    module = case.build(cfg).eval()
    inputs = registry.make_inputs(case, cfg, Shape(BATCH, SRC, TGT), np.random.default_rng(0))
    args = [torch.from_numpy(inputs[spec.name]) for spec in case.inputs(cfg)]
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(*args)
    return counter.get_total_flops()


@pytest.mark.parametrize("preset", PRESET_NAMES)
@pytest.mark.parametrize("case", registry.CASES, ids=lambda c: c.name)
def test_flops_match_torch_flop_counter(case, preset):
    cfg = PRESETS[preset]
    assert case.flop_count(cfg, Shape(BATCH, SRC, TGT)) == counted_flops(case, cfg)


@pytest.mark.parametrize("case", registry.CASES, ids=lambda c: c.name)
def test_a_case_without_a_formula_is_counted_on_its_module(case):
    """The fallback a new case gets: FlopCounterMode on the module built on the meta device."""
    cfg = PRESETS["tiny"]
    uncounted = dataclasses.replace(case, flops=None)
    assert uncounted.flop_count(cfg, Shape(BATCH, SRC, TGT)) == counted_flops(case, cfg)


def test_base_transformer_flops_are_dominated_by_layers_and_head():
    cfg = PRESETS["base"]
    shape = Shape(8, 128, 128)

    def count(name: str) -> int:
        return registry.get_case(name).flop_count(cfg, shape)

    total, head = count("transformer"), count("output_head")
    layers = 6 * (count("encoder_layer") + count("decoder_layer"))
    assert total == head + layers
    assert head == 2 * 8 * 128 * 512 * 37000


def test_weight_bytes_read_count_only_gathered_embedding_rows():
    cfg = PRESETS["base"]
    case = registry.get_case("transformer")
    with torch.device("meta"):
        full = sum(p.numel() for p in case.build(cfg).parameters()) * 4
    streamed = case.weight_bytes_read(cfg, Shape(1, 32, 32))
    # Two 37000 x 512 tables, of which 32 rows each are read.
    assert full - streamed == 2 * (37000 - 32) * 512 * 4
