"""Trained checkpoints: weights of the reference Transformer that solve a synthetic task.

Random weights (tconform.weights) give logits whose top two are close, so a token flipped by
int8 or bfloat16 rounding says little about the rounding. A model trained on a task has wide
top-1 margins where it is sure, and a flip there is a real error; the task's answer is known,
so decoded sequences can be scored without a golden.

The checkpoints are made by scripts/train_checkpoint.py and committed under
tconform/data/checkpoints/: <name>.npz (float32 arrays, keyed by the Transformer's parameter
names) and <name>.json (config, task, training record and the sha256 of the .npz).

Tasks read a source of MIN_LEN..max_seq_len-2 symbols (ids FIRST_SYMBOL.. below the source
vocabulary; 0, 1 and 2 are the generation driver's pad, begin and end tokens) and answer with
the same symbols, reversed or sorted, then the end token. One source in eight, chosen by a hash
of its symbols, is held out: training never sees it, and the held-out batches are drawn from
those only.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tconform.config import ModelConfig
from tconform.errors import UsageError
from tconform.generation.driver import BOS, EOS, PAD, Decoding, Generation, Strategy, generate
from tconform.generation.steppers import make_stepper, oracle_sessions

FIRST_SYMBOL = 3  # after PAD, BOS and EOS
MIN_LEN = 2
HELD_OUT_EVERY = 8  # one source in eight is held out (by hash)

TASKS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "reverse": lambda symbols: symbols[::-1],
    "sort": np.sort,
}


def max_len(cfg: ModelConfig) -> int:
    """The longest source: its answer plus the end token must fit after the begin token."""
    return cfg.max_seq_len - 2


def is_held_out(symbols: np.ndarray) -> bool:
    """Whether a source (its symbols, no padding) belongs to the held-out part."""
    return zlib.crc32(np.asarray(symbols, dtype=np.int64).tobytes()) % HELD_OUT_EVERY == 0


def draw_sources(
    cfg: ModelConfig, rng: np.random.Generator, count: int, held_out: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(src_ids, src_keep), each (count, max_len): sources from the held-out part or from the
    training part, right-padded with PAD."""
    width = max_len(cfg)
    rows: list[np.ndarray] = []
    while len(rows) < count:
        # Drawn in chunks so the stream, and so the sources, depend only on rng and count.
        lengths = rng.integers(MIN_LEN, width + 1, 4 * count)
        symbols = rng.integers(FIRST_SYMBOL, cfg.src_vocab, (4 * count, width))
        for length, row in zip(lengths, symbols, strict=True):
            if is_held_out(row[:length]) == held_out:
                rows.append(np.where(np.arange(width) < length, row, PAD))
    src_ids = np.stack(rows[:count]).astype(np.int64)
    return src_ids, src_ids != PAD


def held_out_batch(cfg: ModelConfig, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(src_ids, src_keep) of `count` held-out sources, the same for the same seed."""
    return draw_sources(cfg, np.random.default_rng([seed, 0x48454C44]), count, held_out=True)


def answers(task: str, src_ids: np.ndarray, src_keep: np.ndarray) -> np.ndarray:
    """(B, max_len + 1) int64: each source's answer, then EOS, then PAD."""
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    out = np.full((len(src_ids), src_ids.shape[1] + 1), PAD, dtype=np.int64)
    for row, (ids, keep) in enumerate(zip(src_ids, src_keep, strict=True)):
        answer = TASKS[task](ids[keep])
        out[row, : len(answer)] = answer
        out[row, len(answer)] = EOS
    return out


def teacher_inputs(targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tgt_ids, tgt_keep) the decoder reads in training: BOS, then each answer token but the
    last (EOS); the keep mask is False where the target is padding."""
    tgt_ids = np.concatenate([np.full((len(targets), 1), BOS), targets[:, :-1]], axis=1)
    tgt_keep = targets != PAD
    return np.where(tgt_keep, tgt_ids, PAD).astype(np.int64), tgt_keep


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> bytes:
    """Write `arrays` as an .npz whose bytes depend only on the arrays (np.savez stamps the
    current time into the zip), so a rerun gives the same sha256. Returns the bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in arrays:  # the order given: named_parameters() order
            entry = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            entry.compress_type = zipfile.ZIP_DEFLATED
            array = io.BytesIO()
            np.lib.format.write_array(array, np.ascontiguousarray(arrays[name]))
            archive.writestr(entry, array.getvalue())
    data = buffer.getvalue()
    path.write_bytes(data)
    return data


def oracle_greedy(
    cfg: ModelConfig, params: dict[str, np.ndarray], src_ids: np.ndarray, src_keep: np.ndarray
) -> Generation:
    """Greedy decoding by the float64 oracle (with the key/value cache), long enough for any
    answer of a source of max_len symbols plus its end token."""
    stepper = make_stepper(oracle_sessions(cfg, params), cfg, cache=True, oracle=True)
    decoding = Decoding(max_new_tokens=max_len(cfg) + 1)
    return generate(stepper, src_ids, src_keep, decoding, Strategy("greedy"))


def score(task: str, src_ids: np.ndarray, src_keep: np.ndarray, tokens: np.ndarray) -> dict:
    """token_accuracy: the share of answer tokens (end token included) decoded right, position
    by position; sequence_accuracy: the share of sources whose decoded sequence is the answer
    exactly (nothing missing, nothing extra)."""
    expected = answers(task, src_ids, src_keep)
    width = max(expected.shape[1], tokens.shape[1])
    expected = np.pad(expected, ((0, 0), (0, width - expected.shape[1])), constant_values=PAD)
    tokens = np.pad(tokens, ((0, 0), (0, width - tokens.shape[1])), constant_values=PAD)
    scored = expected != PAD
    return {
        "token_accuracy": float((tokens == expected)[scored].mean()),
        "sequence_accuracy": float((tokens == expected).all(axis=1).mean()),
    }


def top1_margins(generation: Generation) -> np.ndarray:
    """Per decoded step (up to each sequence's end): the top logit minus the runner-up. A
    log-softmax shifts a row's logits by one constant, so log-probabilities give the same."""
    steps = np.arange(generation.tokens.shape[1])[None, :] < generation.lengths[:, None]
    top2 = np.sort(generation.log_probs[steps], axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0]
