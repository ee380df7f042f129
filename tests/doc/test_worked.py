"""The documents' worked numbers: the verdicts an independent reading expects."""

import math

import numpy as np
import pytest

from tconform.doc import verdict, worked

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def by_id() -> dict[str, worked.DocCase]:
    return {case.id: case for case in worked.document_cases()}


def test_every_case_cites_a_source_and_section(by_id):
    for case in by_id.values():
        assert case.source and case.section and case.quantity
        assert case.verdict in verdict.VERDICTS
        assert case.printed.shape == case.exact.shape


def test_q_k_v_hold_but_the_score_matrix_is_wrong(by_id):
    for name in ("q", "k", "v"):
        assert by_id[f"000-attention-{name}"].verdict == verdict.HOLDS
    scores = by_id["000-attention-scores"]
    assert scores.verdict == verdict.ERRATUM
    assert scores.exact[0, 0] == pytest.approx(2.1 * 1.5 + 2.5 * 1.4)  # 6.65, printed 7.7
    assert scores.printed[0, 0] == 7.7
    assert len(scores.corrected) == 9  # every entry of the printed QK^T is off
    assert by_id["000-attention-scaled-scores"].verdict == verdict.ERRATUM


def test_pytorch_printed_weights_and_context_follow_the_correct_scores(by_id):
    assert by_id["000-attention-weights"].verdict == verdict.HOLDS
    assert by_id["000-attention-context"].verdict == verdict.HOLDS
    assert "follow from the correct scores" in by_id["000-attention-weights"].note


def test_pe_expressions_written_with_d_model_8_are_errata_where_the_value_changes(by_id):
    pos1 = by_id["000-pe-pos1"]
    assert pos1.verdict == verdict.ERRATUM
    # sin(1/10000^(2/8)) = sin(0.1) as written, the formula at d=512 gives sin(1/10000^(2/512))
    assert pos1.printed[2] == pytest.approx(math.sin(0.1))
    assert pos1.exact[2] == pytest.approx(math.sin(1 / 10000 ** (2 / 512)))
    # pos 0 is written with the same d_model=8 exponents, but sin(0) and cos(0) do not care.
    pos0 = by_id["000-pe-pos0"]
    assert pos0.worst_deviation == 0.0 and pos0.verdict == verdict.HOLDS
    assert "2/8" in pos0.note


def test_x_pe_only_the_last_row_pair_is_wrong_and_uses_base_100(by_id):
    x_pe = by_id["001-pe-x-pe"]
    assert x_pe.verdict == verdict.ERRATUM
    assert [index for index, _, _ in x_pe.corrected] == [[3, 2], [3, 3]]
    assert x_pe.exact[1, 2] == pytest.approx(0.4 + math.sin(1 / 100))  # printed 0.41: holds
    assert "base 100" in x_pe.note


@pytest.mark.parametrize(
    "case_id",
    [
        "001-pe-code-n100",
        "001-dictionary-lookup",
        "002-shape-positionalencoder",
        "002-shape-multiheadattention",
        "002-shape-feedforward",
        "002-module-tree",
        "004-pe-wavelengths",
    ],
)
def test_correct_numbers_are_not_flagged(by_id, case_id):
    assert by_id[case_id].verdict == verdict.HOLDS
    assert by_id[case_id].corrected == []


@pytest.mark.parametrize(
    "case_id", ["002-pe-listing", "001-layernorm-listing", "002-layernorm-listing"]
)
def test_listings_that_contradict_their_formula_deviate(by_id, case_id):
    assert by_id[case_id].verdict == verdict.DEVIATES
    assert by_id[case_id].worst_deviation > 1e-4


def test_the_doc002_pe_listing_agrees_with_the_formula_in_column_0_only():
    listing = worked.oracle.sinusoid_table(80, 512, formula="doc002_listing")
    formula = worked.oracle.sinusoid_table(80, 512)
    agrees = np.all(np.abs(listing - formula) < 1e-12, axis=0)
    assert agrees[0]  # column 0: exponent 0 in both
    assert not agrees[1:].any()


def test_paper_counts_within_5_percent_except_n2(by_id):
    paper = by_id["paper-table3-params"]
    assert paper.verdict == verdict.DIFFERS
    assert "N=2" in paper.note and len(paper.corrected) == 1


def test_doc004_names_the_encoder_where_the_masked_sublayer_is_the_decoders(by_id):
    case = by_id["004-masked-sublayer"]
    assert case.verdict == verdict.ERRATUM and case.exact.tolist() == [0.0]
    assert case.note.endswith("by 0")  # the decoder's masked self-attention leaks nothing
