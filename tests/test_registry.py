import numpy as np
import pytest

from tconform import registry
from tconform.config import PRESETS

pytestmark = pytest.mark.unit

TINY = PRESETS["tiny"]


def test_case_names_are_unique_and_cover_every_component():
    assert len(set(registry.case_names())) == len(registry.CASES)
    for name in (
        "embedding",
        "positional_encoding",
        "attention",
        "mha_self",
        "mha_causal",
        "mha_cross",
        "feed_forward",
        "norm",
        "encoder_layer",
        "decoder_layer",
        "encoder",
        "decoder",
        "output_head",
        "transformer",
    ):
        assert name in registry.case_names()


def test_padding_masks_keep_at_least_one_real_token_and_pad_the_rest():
    assert registry.keep_lengths(3, 12) == [12, 7, 2]
    assert registry.keep_lengths(1, 1) == [1]
    assert min(registry.keep_lengths(5, 3)) >= 1


def test_inputs_follow_the_symbolic_axes():
    case = registry.get_case("decoder_layer")
    inputs = registry.make_inputs(case, TINY, registry.Shape(2, 7, 5), np.random.default_rng(0))
    assert inputs["y"].shape == (2, 5, 16) and inputs["y"].dtype == np.float32
    assert inputs["memory"].shape == (2, 7, 16)
    assert inputs["src_keep"].dtype == np.bool_ and inputs["src_keep"][1].sum() == 4
    ids = registry.make_inputs(
        registry.get_case("transformer"), TINY, registry.Shape(3, 12, 9), np.random.default_rng(0)
    )
    assert ids["tgt_ids"].max() < TINY.tgt_vocab and ids["src_ids"].dtype == np.int64


def test_every_attention_mask_row_attends_somewhere():
    case = registry.get_case("attention")
    mask = registry.make_inputs(case, TINY, registry.Shape(3, 12, 12), np.random.default_rng(1))[
        "mask"
    ]
    assert mask.any(axis=-1).all() and not mask.all()
