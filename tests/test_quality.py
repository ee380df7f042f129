"""tconform.quality: top-1 agreement, KL divergence, SQNR per output and greedy token agreement,
each checked against a figure computed another way (a loop over positions in plain Python
arithmetic, or the construction of the case) and on cases that must come out bad."""

import math

import numpy as np
import pytest

from tconform.compare import sqnr_db
from tconform.quality import (
    kl_divergence,
    log_softmax,
    output_sqnr,
    token_agreement,
    top1_agreement,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def logits():
    """(2, 5, 7) float64 oracle logits, with top-1 margins wide enough that small noise keeps
    every argmax."""
    rng = np.random.default_rng(7)
    values = rng.normal(size=(2, 5, 7))
    top = values.argmax(axis=-1)
    np.put_along_axis(values, top[..., None], values.max(axis=-1, keepdims=True) + 3.0, axis=-1)
    return values


def _kl_by_loop(oracle: np.ndarray, model: np.ndarray) -> float:
    """KL(p || q) averaged over rows, from its definition, one element at a time."""
    rows_p, rows_q = oracle.reshape(-1, oracle.shape[-1]), model.reshape(-1, model.shape[-1])
    total = 0.0
    for row_p, row_q in zip(rows_p, rows_q, strict=True):
        zp = sum(math.exp(x) for x in row_p)
        zq = sum(math.exp(x) for x in row_q)
        total += sum(
            math.exp(a) / zp * (math.log(math.exp(a) / zp) - math.log(math.exp(b) / zq))
            for a, b in zip(row_p, row_q, strict=True)
        )
    return total / len(rows_p)


def test_top1_agreement_counts_the_positions_whose_argmax_moved(logits):
    model = logits + 1e-3 * np.random.default_rng(1).normal(size=logits.shape)
    assert top1_agreement(logits, model) == 1.0
    moved = [(0, 1), (1, 3), (1, 4)]
    for position in moved:  # the runner-up made the top: that position's argmax differs
        row = model[position]
        row[np.argsort(row)[-2]] = row.max() + 1.0
    positions = logits.shape[0] * logits.shape[1]
    assert top1_agreement(logits, model) == pytest.approx((positions - len(moved)) / positions)
    keep = np.ones(logits.shape[:-1], dtype=bool)
    keep[0, 1] = False  # a masked-out position does not count
    expected = (keep.sum() - (len(moved) - 1)) / keep.sum()
    assert top1_agreement(logits, model, keep) == pytest.approx(expected)


def test_kl_divergence_matches_its_definition_and_is_not_symmetric(logits):
    model = logits + 0.3 * np.random.default_rng(2).normal(size=logits.shape)
    found = kl_divergence(logits, model)
    assert found == pytest.approx(_kl_by_loop(logits, model), rel=1e-12)
    assert found > 0
    assert kl_divergence(model, logits) == pytest.approx(_kl_by_loop(model, logits), rel=1e-12)
    assert kl_divergence(model, logits) != pytest.approx(found, rel=1e-6)
    # Logits and log-probabilities of one distribution are the same distribution.
    assert kl_divergence(logits, log_softmax(logits)) == pytest.approx(0.0, abs=1e-15)
    assert kl_divergence(logits, logits + 5.0) == pytest.approx(0.0, abs=1e-15)


def test_kl_divergence_over_masked_positions_and_zero_probabilities(logits):
    model = logits + 0.3 * np.random.default_rng(3).normal(size=logits.shape)
    keep = np.zeros(logits.shape[:-1], dtype=bool)
    keep[1, :3] = True
    assert kl_divergence(logits, model, keep) == pytest.approx(
        _kl_by_loop(logits[1, :3], model[1, :3]), rel=1e-12
    )
    # A token the oracle rules out (-inf) adds nothing; one the model rules out that the
    # oracle does not makes the divergence infinite.
    oracle = logits.copy()
    oracle[..., 0] = -np.inf
    expected = _kl_by_loop(oracle[..., 1:], model[..., 1:])
    shifted = model.copy()
    shifted[..., 0] = -np.inf
    assert kl_divergence(oracle, shifted) == pytest.approx(expected, rel=1e-12)
    assert kl_divergence(logits, shifted) == math.inf


def test_output_sqnr_is_compares_sqnr_over_finite_elements(logits):
    noise = 1e-2 * np.random.default_rng(4).normal(size=logits.shape)
    oracle = {"log_probs": logits, "memory": logits[0]}
    model = {"log_probs": logits + noise, "memory": logits[0]}
    found = output_sqnr(oracle, model)
    assert found["log_probs"] == pytest.approx(sqnr_db(logits + noise, logits))
    signal, error = np.sum(logits**2), np.sum(noise**2)
    assert found["log_probs"] == pytest.approx(10 * math.log10(signal / error))
    assert found["memory"] == math.inf
    masked = {"log_probs": np.where(np.arange(7) == 0, -np.inf, logits)}
    noisy = {"log_probs": masked["log_probs"] + noise}
    assert output_sqnr(masked, noisy)["log_probs"] == pytest.approx(
        sqnr_db(logits[..., 1:] + noise[..., 1:], logits[..., 1:])
    )


def test_token_agreement_scores_the_oracles_tokens_and_whole_sequences():
    oracle = np.array([[5, 6, 2, 0], [7, 2, 0, 0], [4, 4, 4, 2]])
    lengths = np.array([3, 2, 4])
    assert token_agreement(oracle, lengths, oracle, lengths) == {"tokens": 1.0, "sequences": 1.0}
    model = oracle.copy()
    model[2, 1] = 9  # one wrong token in the third sequence
    found = token_agreement(oracle, lengths, model, lengths)
    assert found["tokens"] == pytest.approx(1 - 1 / lengths.sum())
    assert found["sequences"] == pytest.approx(2 / 3)
    # Running past the oracle's end (no end token) changes no scored token, but the sequence.
    longer = oracle.copy()
    longer[1, 1:] = [8, 8, 2]
    longer_lengths = np.array([3, 4, 4])
    found = token_agreement(oracle, lengths, longer, longer_lengths)
    assert found["tokens"] == pytest.approx(1 - 1 / lengths.sum())  # its end token became 8
    assert found["sequences"] == pytest.approx(2 / 3)
    # Stopping early: the oracle's tokens the model never decoded are wrong.
    shorter_lengths = np.array([1, 2, 4])
    found = token_agreement(oracle, lengths, oracle, shorter_lengths)
    assert found["tokens"] == pytest.approx(1 - 2 / lengths.sum())


def test_mismatched_shapes_and_masks_are_refused(logits):
    with pytest.raises(ValueError, match="shape"):
        top1_agreement(logits, logits[:, :4])
    with pytest.raises(ValueError, match="mask"):
        kl_divergence(logits, logits, np.ones(logits.shape, dtype=bool))
    with pytest.raises(ValueError, match="no position"):
        top1_agreement(logits, logits, np.zeros(logits.shape[:-1], dtype=bool))
    with pytest.raises(ValueError, match="memory"):
        output_sqnr({"memory": logits}, {"memory": logits[0]})
