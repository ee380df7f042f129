"""FLOP and parameter counts from the config, checked against independent counts: torch's
FlopCounterMode on the reference modules, and the modules' own parameters."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tconform import registry
from tconform.bench.flops import case_flops, case_params, streamed_weight_bytes
from tconform.config import PRESETS
from tconform.registry import Shape

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
    assert case_flops(case.name, cfg, BATCH, SRC, TGT) == counted_flops(case, cfg)


@pytest.mark.parametrize("preset", PRESET_NAMES)
@pytest.mark.parametrize("case", registry.CASES, ids=lambda c: c.name)
def test_params_match_the_reference_module(case, preset):
    cfg = PRESETS[preset]
    module = case.build(cfg)
    assert case_params(case.name, cfg) == sum(p.numel() for p in module.parameters())


def test_base_transformer_flops_are_dominated_by_layers_and_head():
    cfg = PRESETS["base"]
    total = case_flops("transformer", cfg, 8, 128, 128)
    head = case_flops("output_head", cfg, 8, 128, 128)
    layers = 6 * (
        case_flops("encoder_layer", cfg, 8, 128, 128)
        + case_flops("decoder_layer", cfg, 8, 128, 128)
    )
    assert total == head + layers
    assert head == 2 * 8 * 128 * 512 * 37000


def test_streamed_weight_bytes_count_only_gathered_embedding_rows():
    cfg = PRESETS["base"]
    full = case_params("transformer", cfg) * 4
    streamed = streamed_weight_bytes("transformer", cfg, 1, 32)
    # Two 37000 x 512 tables, of which 32 rows each are read.
    assert full - streamed == 2 * (37000 - 32) * 512 * 4
