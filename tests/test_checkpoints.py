"""The committed trained checkpoint: its files check out, and the float64 oracle's greedy
decoding with it solves its task on sources training never saw."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tconform.errors import UsageError
from tconform.generation.driver import EOS, PAD
from tconform.reference import Transformer
from tconform.studies import checkpoints
from tconform.weights import CHECKPOINTS, load_checkpoint, load_params, read_record

pytestmark = pytest.mark.unit


def sources(src_ids: np.ndarray, src_keep: np.ndarray) -> list[np.ndarray]:
    """Each source's symbols, its padding dropped."""
    return [ids[keep] for ids, keep in zip(src_ids, src_keep, strict=True)]


def test_committed_checkpoint_matches_its_record_and_the_model():
    cfg, params = load_checkpoint("reverse")
    record = read_record("reverse")
    assert record["task"] == "reverse"
    assert cfg.to_dict() == record["config"]
    model = Transformer(cfg)
    assert {name: tuple(p.shape) for name, p in model.named_parameters()} == {
        name: value.shape for name, value in params.items()
    }
    for value in params.values():  # float64 holding float32 values, as make_params gives
        assert value.dtype == np.float64
        assert np.array_equal(value.astype(np.float32).astype(np.float64), value)
    load_params(model, params)  # takes every parameter by name
    assert (CHECKPOINTS / "reverse.npz").stat().st_size <= 2 * 1024 * 1024
    # Nothing of the machine that made it: the command is relative, --out left out.
    assert record["command"].startswith("python scripts/train_checkpoint.py --task reverse ")
    assert '"/' not in (CHECKPOINTS / "reverse.json").read_text()


def test_a_corrupted_copy_is_refused(tmp_path):
    for name in ("reverse.npz", "reverse.json"):
        shutil.copy(CHECKPOINTS / name, tmp_path / name)
    load_checkpoint("reverse", tmp_path)  # the intact copy loads
    data = bytearray((tmp_path / "reverse.npz").read_bytes())
    data[len(data) // 2] ^= 0x01
    (tmp_path / "reverse.npz").write_bytes(bytes(data))
    with pytest.raises(UsageError, match="sha256 does not match"):
        load_checkpoint("reverse", tmp_path)
    (tmp_path / "reverse.npz").unlink()
    with pytest.raises(UsageError, match="missing"):
        load_checkpoint("reverse", tmp_path)


def test_an_unknown_checkpoint_names_the_available_ones():
    with pytest.raises(UsageError, match=r"available: .*reverse"):
        load_checkpoint("no-such-task")


def test_held_out_batches_are_deterministic_and_never_trained_on():
    cfg, _ = load_checkpoint("reverse")
    src_ids, src_keep = checkpoints.held_out_batch(cfg, 32, seed=5)
    again_ids, again_keep = checkpoints.held_out_batch(cfg, 32, seed=5)
    assert np.array_equal(src_ids, again_ids) and np.array_equal(src_keep, again_keep)
    assert not np.array_equal(src_ids, checkpoints.held_out_batch(cfg, 32, seed=6)[0])
    assert np.array_equal(src_keep, src_ids != PAD)
    assert all(map(checkpoints.is_held_out, sources(src_ids, src_keep)))
    # Right padding only: every source is a run of symbols, then padding.
    assert np.array_equal(src_keep, np.sort(src_keep, axis=1)[:, ::-1])
    train_ids, train_keep = checkpoints.draw_sources(cfg, np.random.default_rng(0), 64, False)
    assert not any(map(checkpoints.is_held_out, sources(train_ids, train_keep)))


def test_the_oracle_reverses_held_out_sources():
    cfg, params = load_checkpoint("reverse")
    src_ids, src_keep = checkpoints.held_out_batch(cfg, 24, seed=2024)
    result = checkpoints.oracle_greedy(cfg, params, src_ids, src_keep)
    decoded = [tokens[:n].tolist() for tokens, n in zip(result.tokens, result.lengths, strict=True)]
    # The task's definition, written out here: the source's symbols backwards, then the end.
    expected = [[*reversed(symbols.tolist()), EOS] for symbols in sources(src_ids, src_keep)]
    assert decoded == expected
    # Sure of itself: the runner-up logit is well below the chosen one at every step.
    assert checkpoints.top1_margins(result).min() > 2.0


def test_score_counts_tokens_and_whole_sequences():
    src_ids = np.array([[3, 4, 5, PAD], [6, 7, PAD, PAD]])
    src_keep = src_ids != PAD
    decoded = np.array([[5, 4, 3, EOS, PAD], [7, 7, EOS, PAD, PAD]])
    scores = checkpoints.score("reverse", src_ids, src_keep, decoded)
    assert scores == {"token_accuracy": 6 / 7, "sequence_accuracy": 0.5}
    assert checkpoints.answers("sort", np.array([[5, 3, 4]]), np.ones((1, 3), bool)).tolist() == [
        [3, 4, 5, EOS]
    ]
