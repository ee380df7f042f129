"""The figures a reduced-precision model (int8, bfloat16) is judged by against the float64
oracle, beside the element-wise tolerance rows: does it pick the same token, how far is its
distribution from the oracle's, and how loud is its error.

Every function takes the oracle's values and the model's, computes in float64 NumPy, and reads
the last axis as the vocabulary and every other axis as positions; `where`, a boolean mask over
the positions, limits the figure to the positions that count (a decoded sequence's steps up to
its end). Logits and log-probabilities give the same figures: a log-softmax shifts a row by one
constant, which changes neither its argmax nor its distribution.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tconform.compare import sqnr_db


def _positions(values: np.ndarray, where: np.ndarray | None) -> np.ndarray:
    """(N, V) float64: the rows of `values` at the positions `where` selects (all: None)."""
    values = np.asarray(values, dtype=np.float64)
    if where is None:
        return values.reshape(-1, values.shape[-1])
    where = np.asarray(where, dtype=bool)
    if where.shape != values.shape[:-1]:
        raise ValueError(f"mask of shape {where.shape} for positions of shape {values.shape[:-1]}")
    return values[where]


def _pair(oracle, model, where) -> tuple[np.ndarray, np.ndarray]:
    if np.shape(oracle) != np.shape(model):
        raise ValueError(f"oracle shape {np.shape(oracle)} vs model shape {np.shape(model)}")
    p, q = _positions(oracle, where), _positions(model, where)
    if len(p) == 0:
        raise ValueError("no position to compare")
    return p, q


def top1_agreement(oracle: np.ndarray, model: np.ndarray, where: np.ndarray | None = None) -> float:
    """The share of positions whose most probable token (argmax; ties to the lowest id, as the
    greedy decoder breaks them) is the oracle's."""
    p, q = _pair(oracle, model, where)
    return float(np.mean(np.argmax(p, axis=-1) == np.argmax(q, axis=-1)))


def log_softmax(values: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (rows that are -inf but for some tokens stay finite)."""
    values = np.asarray(values, dtype=np.float64)
    top = np.max(values, axis=-1, keepdims=True)
    shifted = values - top
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def kl_divergence(oracle: np.ndarray, model: np.ndarray, where: np.ndarray | None = None) -> float:
    """KL(oracle || model) in nats, the mean over positions: the log-likelihood the model's
    distribution loses on tokens drawn from the oracle's. Tokens the oracle gives probability
    0 contribute nothing; one it gives weight and the model 0 makes it infinite."""
    p, q = _pair(oracle, model, where)
    log_p, log_q = log_softmax(p), log_softmax(q)
    prob = np.exp(log_p)
    with np.errstate(invalid="ignore"):  # -inf - -inf where both are 0: no contribution
        terms = np.where(prob > 0, prob * (log_p - log_q), 0.0)
    return float(np.mean(np.sum(terms, axis=-1)))


def output_sqnr(
    oracle: Mapping[str, np.ndarray], model: Mapping[str, np.ndarray]
) -> dict[str, float]:
    """SQNR in dB (tconform.compare.sqnr_db) of each output the oracle has, over its finite
    elements (a -inf log-probability, the mask fill's, is the same in both and no noise)."""
    found = {}
    for name, golden in oracle.items():
        golden = np.asarray(golden, dtype=np.float64)
        actual = np.asarray(model[name], dtype=np.float64)
        if golden.shape != actual.shape:
            raise ValueError(f"{name}: oracle shape {golden.shape} vs model shape {actual.shape}")
        finite = np.isfinite(golden) & np.isfinite(actual)
        found[name] = sqnr_db(actual[finite], golden[finite])
    return found


def token_agreement(
    oracle: np.ndarray, oracle_lengths: np.ndarray, model: np.ndarray, model_lengths: np.ndarray
) -> dict[str, float]:
    """Decoded sequences, (B, T) tokens with each row's length: `tokens`, the share of the
    oracle's tokens (its end token included) that the model decoded at the same step;
    `sequences`, the share of rows the model decoded exactly (same length, same tokens)."""
    oracle, model = np.asarray(oracle), np.asarray(model)
    oracle_lengths, model_lengths = np.asarray(oracle_lengths), np.asarray(model_lengths)
    width = max(oracle.shape[1], model.shape[1])
    steps = np.arange(width)[None, :]
    # Past its own length a row holds no token: -1 there, so a step only one side decoded differs.
    mine = np.where(steps < model_lengths[:, None], _widen(model, width), -1)
    theirs = np.where(steps < oracle_lengths[:, None], _widen(oracle, width), -1)
    equal = mine == theirs
    scored = steps < oracle_lengths[:, None]
    return {
        "tokens": float(equal[scored].mean()),
        "sequences": float(equal.all(axis=1).mean()),
    }


def _widen(tokens: np.ndarray, width: int) -> np.ndarray:
    return np.pad(tokens, ((0, 0), (0, width - tokens.shape[1])), constant_values=-1)
