"""The PyTorch reference run in float64 implements the documented math: it agrees with the
independent NumPy oracle to 1e-10 for every component and every variant option."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tconform import registry
from tconform.config import PRESETS
from tconform.weights import load_params, make_params

pytestmark = pytest.mark.unit

TINY = PRESETS["tiny"]

# The tiny preset, each variant option flipped on its own, and the documents' full variants.
VARIANT_CONFIGS = {
    "paper": TINY,
    "norm=std": TINY.replace(norm="std"),
    "placement=pre": TINY.replace(placement="pre"),
    "final_norm": TINY.replace(final_norm=True),
    "no attn_bias": TINY.replace(attn_bias=False),
    "no ffn_bias": TINY.replace(ffn_bias=False),
    "ffn_mult=1": TINY.replace(ffn_mult=1),
    "no head_bias": TINY.replace(head_bias=False),
    "no embed_scale": TINY.replace(embed_scale=False),
    "mask_fill=-1e9": TINY.replace(mask_fill="-1e9"),
    "pe_base=100": TINY.replace(pe_base=100.0),
    "pe_formula=doc002_listing": TINY.replace(pe_formula="doc002_listing"),
    "decoder_input=source": TINY.replace(decoder_input="source"),
    "tiny-doc001": PRESETS["tiny-doc001"],
    "tiny-doc002": PRESETS["tiny-doc002"],
}


@pytest.mark.parametrize("variant", list(VARIANT_CONFIGS))
@pytest.mark.parametrize("case", registry.CASES, ids=registry.case_names())
def test_reference_float64_matches_oracle(case, variant):
    cfg = VARIANT_CONFIGS[variant]
    module = case.build(cfg).double()
    params = make_params(module, seed=7)
    load_params(module, params)
    inputs = registry.make_inputs(case, cfg, registry.Shape(3, 11, 6), np.random.default_rng(3))
    expected = registry.run_oracle(case, cfg, params, inputs)
    args = [
        torch.from_numpy(inputs[s.name]).double()
        if s.kind == "float"
        else torch.from_numpy(inputs[s.name])
        for s in case.inputs(cfg)
    ]
    with torch.no_grad():
        got = module(*args)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape
        np.testing.assert_allclose(g.numpy(), e, rtol=0, atol=1e-10)


def test_variants_really_differ():
    """Each option changes the whole model's output, so the agreement above is not vacuous."""
    case = registry.get_case("transformer")
    shape = registry.Shape(2, 6, 6)

    def output(cfg):
        params = make_params(case.build(cfg), seed=7)
        inputs = registry.make_inputs(case, cfg, shape, np.random.default_rng(3))
        return registry.run_oracle(case, cfg, params, inputs)[0]

    base = output(TINY)
    for name, cfg in VARIANT_CONFIGS.items():
        if name in ("paper", "mask_fill=-1e9"):
            continue  # -1e9 and -inf both give exp(...) = 0 in float64
        other = output(cfg)
        assert other.shape != base.shape or not np.allclose(other, base, atol=1e-6), name
