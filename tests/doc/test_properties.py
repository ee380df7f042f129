"""Each stated property holds on the oracle for drawn inputs and FAILS on a broken variant."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tconform import oracle, reference
from tconform.config import PRESETS
from tconform.doc import properties
from tconform.weights import make_params

pytestmark = pytest.mark.unit

FAST = settings(max_examples=25, deadline=None)
LIMIT = properties.LIMITS["float64"]
TINY = PRESETS["tiny"]

d_models = st.sampled_from([2, 4, 8, 16, 64])
bases = st.sampled_from([100.0, 10000.0])


@FAST
@given(length=st.integers(2, 20), d_model=d_models, base=bases)
def test_pe_shift_is_a_rotation(length, d_model, base):
    table = oracle.sinusoid_table(length, d_model, base)
    assert properties.pe_shift_violation(table, base) <= LIMIT


@FAST
@given(length=st.integers(3, 20), d_model=st.sampled_from([4, 8, 16, 64]), base=bases)
def test_pe_shift_fails_with_a_wrong_frequency_or_doc002s_listing(length, d_model, base):
    wrong_frequency = oracle.sinusoid_table(length, d_model, base * 3)
    listing = oracle.sinusoid_table(length, d_model, base, formula="doc002_listing")
    assert properties.pe_shift_violation(wrong_frequency, base) > 1e-3
    assert properties.pe_shift_violation(listing, base) > 1e-3


@FAST
@given(d_model=d_models, base=bases)
def test_pe_wavelengths_are_geometric_from_2pi(d_model, base):
    table = oracle.sinusoid_table(2, d_model, base)
    assert properties.pe_wavelength_violation(table, base) <= LIMIT


@FAST
@given(d_model=st.sampled_from([4, 8, 16, 64]), base=bases)
def test_pe_wavelengths_fail_with_a_wrong_ratio_or_a_wrong_start(d_model, base):
    wrong_ratio = oracle.sinusoid_table(2, d_model, base / 2)
    assert properties.pe_wavelength_violation(wrong_ratio, base) > 1e-3
    wrong_start = oracle.sinusoid_table(3, d_model, base)[[0, 2]]  # row pos=2: ω_0 looks like 2
    assert properties.pe_wavelength_violation(wrong_start, base) > 1e-3


@FAST
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 6), cols=st.integers(1, 9))
def test_softmax_rows_sum_to_one_and_a_wrong_axis_breaks_it(seed, rows, cols):
    scores = np.random.default_rng(seed).normal(0, 5, (2, rows, cols))
    assert properties.softmax_row_violation(oracle.softmax(scores)) <= LIMIT
    if rows > 1:  # normalising over the query axis instead: rows no longer sum to 1
        assert properties.softmax_row_violation(oracle.softmax(scores, axis=-2)) > 1e-6


def _self_attention(causal: bool):
    """ids -> masked (or not) multi-head self-attention over embedded ids, on the oracle."""
    params = make_params(_mha_module(), 0)
    table = np.random.default_rng(1).normal(size=(TINY.tgt_vocab, TINY.d_model))

    def run(ids):
        x = table[ids]
        keep = np.ones(ids.shape, dtype=bool)
        return oracle.multi_head_attention(params, TINY, x, x, keep, causal=causal)

    return run


def _mha_module():
    return reference.MultiHeadAttention(TINY)


tokens = st.lists(st.integers(0, TINY.tgt_vocab - 1), min_size=2, max_size=7).map(
    lambda ids: np.array([ids])
)


@FAST
@given(ids=tokens)
def test_causal_mask_hides_the_future_and_a_leaky_mask_is_caught(ids):
    assert properties.causal_violation(_self_attention(True), ids, TINY.tgt_vocab) <= LIMIT
    assert properties.causal_violation(_self_attention(False), ids, TINY.tgt_vocab) > 1e-6


@FAST
@given(seed=st.integers(0, 10_000), seq=st.integers(1, 6))
def test_multi_head_equals_concat_of_single_heads(seed, seq):
    params = {f"attn.{k}": v for k, v in make_params(_mha_module(), seed).items()}
    x = np.random.default_rng(seed).normal(size=(1, seq, TINY.d_model))
    keep = np.ones((1, seq), dtype=bool)
    attn = {k.removeprefix("attn."): v for k, v in params.items()}
    out = oracle.multi_head_attention(attn, TINY, x, x, keep)
    assert properties.multi_head_violation(out, params, TINY, x, keep) <= LIMIT
    # Broken: heads cut from interleaved columns instead of contiguous blocks.
    perm = np.arange(TINY.d_model).reshape(TINY.d_head, TINY.n_heads).T.ravel()
    broken = dict(attn)
    for w in ("w_q", "w_k", "w_v"):
        broken[f"{w}.weight"] = attn[f"{w}.weight"][perm]
        if f"{w}.bias" in attn:
            broken[f"{w}.bias"] = attn[f"{w}.bias"][perm]
    wrong = oracle.multi_head_attention(broken, TINY, x, x, keep)
    assert properties.multi_head_violation(wrong, params, TINY, x, keep) > 1e-6


def test_shape_check_catches_a_dropped_position():
    x = np.zeros((2, 5, TINY.d_model))
    assert properties.shape_violation(x, x.shape) == 0.0
    assert properties.shape_violation(x[:, :-1], x.shape) == 1.0


def test_table3_counts_hold_with_a_shared_embedding_and_fail_without():
    shared = properties.paper_count_violations(properties.paper_counts(shared_embedding=True))
    within = {name for name, off in shared.items() if off <= properties.PAPER_COUNT_TOLERANCE}
    # N=2 is 6.4% off: the paper's counts fit a ~41k-row embedding, see docs/errata.md.
    assert within == set(shared) - {"N=2"}
    separate = properties.paper_count_violations(properties.paper_counts(shared_embedding=False))
    assert all(off > properties.PAPER_COUNT_TOLERANCE for off in separate.values())
