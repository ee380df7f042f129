"""One decoding driver for every runtime: it asks a stepper for the next step's log-probabilities
and decides everything else itself (doc 003, section 3.2: encode once, then generate one token
at a time from the tokens so far, until the end token).

Definitions (docs/generation.md repeats them):
- Every sequence starts from a prefix (default: the begin token alone; left-padded prompts are
  allowed, padding fed with keep=False). A sequence ends when it produces the end token (which
  counts as one of its tokens) or after `max_new_tokens` tokens; finished sequences of a batch
  keep being fed the end token, and their later tokens are the pad id.
- greedy: the most probable token; ties go to the lowest token id.
- beam search (width W, length penalty alpha): each source keeps W hypotheses; each step takes
  the 2W best continuations of all of them by summed log-probability; a continuation ending in
  the end token becomes a finished hypothesis if it ranks among the first W, the others stay
  alive (up to W). A source is done once it has W finished hypotheses; at the length limit the
  alive ones are finished as they are. The answer is the finished hypothesis with the highest
  sum(log p) / lp(len), the GNMT length penalty lp(len) = ((5 + len) / 6) ** alpha (alpha = 0:
  no normalisation), len counting the end token. Ordering ties go to the lower flat index.
- sampling: top-k keeps the k most probable tokens (ties to the lower id), top-p the smallest
  set of most probable tokens whose probability reaches p; the kept probabilities, renormalised,
  are laid out in token-id order and one uniform draw per sequence per step (drawn for every
  sequence, finished or not, from a NumPy Generator seeded by the driver) picks the token whose
  cumulative interval holds it. The same seed gives the same stream on every runtime, so a
  sampled sequence differs between runtimes only where their probabilities do.
- degenerate steps: log-probabilities of the wrong shape, or a live sequence's that hold +inf or
  are -inf for every token, are no distribution and no strategy can choose from them: decoding
  stops with `DegenerateOutput`, a conformance failure (exit 1) of the runtime that produced
  them, with a message naming the step and sequence. NaN is not refused here: the oracle's own
  rows are NaN where a prompt starts with padding under the -inf mask fill (docs/generation.md),
  and the verdict judges NaN against the golden like any value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tconform.config import ModelConfig
from tconform.errors import EXIT_FAILURE, TconformError, UsageError
from tconform.generation.steppers import Stepper

STRATEGIES = ("greedy", "beam", "sample")
BOS, EOS, PAD = 1, 2, 0  # the tokens tconform's goldens use; any id below the vocabulary works


class DegenerateOutput(TconformError):
    """A decoding step's log-probabilities are no distribution (see the module docstring): a
    conformance failure of what produced them, exit 1."""

    exit_code = EXIT_FAILURE


def require_distribution(
    log_probs: np.ndarray, live: np.ndarray, step: int, shape: tuple[int, int]
) -> None:
    """DegenerateOutput unless `log_probs` has `shape` (rows x vocabulary) and every live row
    can be decoded from: no +inf, and at least one token above -inf (see the module
    docstring for NaN)."""
    values = np.asarray(log_probs)
    if values.shape != shape:
        raise DegenerateOutput(
            f"decoding step {step}: log-probabilities of shape {list(values.shape)}, where "
            f"{list(shape)} (sequences x vocabulary) is expected"
        )
    rows = np.flatnonzero(live)
    problems = {
        "hold +inf": np.isposinf(values[rows]).any(axis=1),
        "are -inf for every token": (values[rows] == -np.inf).all(axis=1),
    }
    for what, bad in problems.items():
        if bad.any():
            first = int(rows[np.argmax(bad)])
            raise DegenerateOutput(
                f"decoding step {step}: the log-probabilities of sequence {first} {what} "
                f"({int(bad.sum())} of {len(rows)} live sequences): no token can be chosen"
            )


@dataclass(frozen=True)
class Strategy:
    kind: str = "greedy"  # greedy | beam | sample
    beam_width: int = 4
    length_penalty: float = 0.6  # alpha of the GNMT length penalty
    top_k: int | None = None  # sampling: keep the k most probable (None: all)
    top_p: float = 1.0  # sampling: nucleus mass
    seed: int = 0  # sampling: the driver's random stream

    @property
    def name(self) -> str:
        if self.kind == "beam":
            return f"beam{self.beam_width}"
        if self.kind == "sample":
            k = f"k{self.top_k}" if self.top_k else ""
            p = f"p{self.top_p:g}" if self.top_p < 1 else ""
            return f"sample-{k}{p}-s{self.seed}".replace("--", "-")
        return "greedy"


@dataclass(frozen=True)
class Decoding:
    max_new_tokens: int
    eos_id: int | None = EOS  # None: no end token, every sequence runs to max_new_tokens
    bos_id: int = BOS
    pad_id: int = PAD


def check_request(cfg: ModelConfig, decoding: Decoding, strategy: Strategy, prefix_len: int = 1):
    """Bad input, refused before anything runs (a UsageError: one line, exit 2)."""
    if strategy.kind not in STRATEGIES:
        raise UsageError(f"unknown strategy {strategy.kind!r}; choose from {', '.join(STRATEGIES)}")
    room = cfg.max_seq_len - prefix_len
    if not 1 <= decoding.max_new_tokens <= room:
        raise UsageError(
            f"max new tokens {decoding.max_new_tokens}: must be 1..{room} (the preset's maximum "
            f"length {cfg.max_seq_len} minus a prefix of {prefix_len})"
        )
    names = {"eos_id": "end token (--end-token)", "bos_id": "start token", "pad_id": "pad token"}
    for field_name, name in names.items():
        value = getattr(decoding, field_name)
        if value is not None and not 0 <= value < cfg.tgt_vocab:
            raise UsageError(f"{name} {value} outside the vocabulary 0..{cfg.tgt_vocab - 1}")
    if strategy.kind == "beam" and not 1 <= strategy.beam_width <= cfg.tgt_vocab:
        raise UsageError(f"beam width {strategy.beam_width}: must be 1..{cfg.tgt_vocab}")
    if strategy.kind == "sample":
        if strategy.top_k is not None and not 1 <= strategy.top_k <= cfg.tgt_vocab:
            raise UsageError(f"top-k {strategy.top_k}: must be 1..{cfg.tgt_vocab}")
        if not 0 < strategy.top_p <= 1:
            raise UsageError(f"top-p {strategy.top_p}: must be in (0, 1]")
    if strategy.length_penalty < 0:
        raise UsageError(f"length penalty {strategy.length_penalty}: must be >= 0")


@dataclass
class Generation:
    tokens: np.ndarray  # (B, T) int64; pad id after each sequence's end
    lengths: np.ndarray  # (B,) tokens generated, the end token included
    log_probs: np.ndarray  # (B, T, V) float64: each step's distribution (0 after the end)

    @property
    def chosen(self) -> np.ndarray:
        """(B, T) log-probability of each generated token (0 after the end)."""
        picked = np.take_along_axis(self.log_probs, self.tokens[..., None], axis=2)[..., 0]
        steps = np.arange(self.tokens.shape[1])[None, :]
        return np.where(steps < self.lengths[:, None], picked, 0.0)


def default_prefix(batch: int, decoding: Decoding) -> tuple[np.ndarray, np.ndarray]:
    return np.full((batch, 1), decoding.bos_id, dtype=np.int64), np.ones((batch, 1), dtype=bool)


def generate(
    stepper: Stepper,
    src_ids: np.ndarray,
    src_keep: np.ndarray,
    decoding: Decoding,
    strategy: Strategy,
    prefix: tuple[np.ndarray, np.ndarray] | None = None,
) -> Generation:
    """Decode a batch of sources with `strategy`; `prefix` = (ids, keep), each (B, P)."""
    prefix_ids, prefix_keep = prefix or default_prefix(len(src_ids), decoding)
    stepper.start(src_ids, src_keep)
    log_probs = None
    for j in range(prefix_ids.shape[1]):
        log_probs = stepper.step(prefix_ids[:, j], prefix_keep[:, j])
    shape = np.shape(log_probs)
    if len(shape) != 2 or shape[0] != len(src_ids) or shape[1] < 1:
        raise DegenerateOutput(
            f"decoding step 1: log-probabilities of shape {list(shape)}, where "
            f"[{len(src_ids)}, vocabulary] is expected"
        )
    if strategy.kind == "beam":
        return _beam(stepper, log_probs, decoding, strategy)
    return _one_per_sequence(stepper, log_probs, decoding, strategy)


def teacher_forced(
    stepper: Stepper, src_ids: np.ndarray, src_keep: np.ndarray, tokens: np.ndarray
) -> np.ndarray:
    """(B, T, V): the stepper's log-probabilities at each step, fed the begin token and then
    `tokens` (another decoder's, the oracle's), whatever it would have chosen itself. Steps past
    a sequence's end are fed its padding and are not meant to be scored."""
    stepper.start(src_ids, src_keep)
    keep = np.ones(len(src_ids), dtype=bool)
    steps = [stepper.step(np.full(len(src_ids), BOS), keep)]
    for column in tokens.T[:-1]:
        steps.append(stepper.step(column, keep))
    return np.stack(steps, axis=1)


def _one_per_sequence(stepper, log_probs, decoding: Decoding, strategy: Strategy) -> Generation:
    batch, vocab = log_probs.shape
    rng = np.random.default_rng(strategy.seed)
    tokens = np.full((batch, decoding.max_new_tokens), decoding.pad_id, dtype=np.int64)
    dists = np.zeros((batch, decoding.max_new_tokens, vocab))
    lengths = np.zeros(batch, dtype=np.int64)
    done = np.zeros(batch, dtype=bool)
    for t in range(decoding.max_new_tokens):
        require_distribution(log_probs, ~done, t + 1, (batch, vocab))
        if strategy.kind == "sample":
            chosen = sample(log_probs, strategy, rng.random(batch))
        else:
            chosen = log_probs.argmax(axis=1)  # the first maximum: ties to the lowest id
        live = ~done
        tokens[live, t] = chosen[live]
        dists[live, t] = log_probs[live]
        lengths[live] += 1
        if decoding.eos_id is not None:
            done |= chosen == decoding.eos_id
        if done.all() or t + 1 == decoding.max_new_tokens:
            break
        fed = chosen if decoding.eos_id is None else np.where(done, decoding.eos_id, chosen)
        log_probs = stepper.step(fed, np.ones(batch, dtype=bool))
    return Generation(tokens, lengths, dists)


def sample(log_probs: np.ndarray, strategy: Strategy, draws: np.ndarray) -> np.ndarray:
    """One token per row from the top-k / top-p filtered distribution, picked by `draws`
    (uniform in [0, 1)) over the kept probabilities in token-id order."""
    probs = np.exp(log_probs - log_probs.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    order = np.argsort(-probs, axis=1, kind="stable")  # most probable first, ties to lower id
    ranked = np.take_along_axis(probs, order, axis=1)
    kept_ranked = np.ones_like(ranked, dtype=bool)
    if strategy.top_k is not None:
        kept_ranked[:, strategy.top_k :] = False
    if strategy.top_p < 1:
        before = np.cumsum(ranked, axis=1) - ranked  # mass of the more probable tokens
        kept_ranked &= before < strategy.top_p
    kept = np.zeros_like(kept_ranked)
    np.put_along_axis(kept, order, kept_ranked, axis=1)
    weights = np.where(kept, probs, 0.0)
    cumulative = np.cumsum(weights, axis=1)
    targets = draws * cumulative[:, -1]
    picked = (cumulative <= targets[:, None]).sum(axis=1)
    # A draw can only land on a kept token; guard the float edge where it lands on the last sum.
    return np.minimum(picked, weights.shape[1] - 1 - np.argmax(kept[:, ::-1], axis=1))


def length_penalty(length: int | np.ndarray, alpha: float):
    """GNMT: ((5 + len) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def _beam(stepper, log_probs, decoding: Decoding, strategy: Strategy) -> Generation:
    batch, vocab = log_probs.shape
    width, steps = strategy.beam_width, decoding.max_new_tokens
    stepper.reorder(np.repeat(np.arange(batch), width))
    log_probs = np.repeat(log_probs, width, axis=0)
    shape = (batch * width, vocab)
    scores = np.full((batch, width), -np.inf)
    scores[:, 0] = 0.0  # the beams start identical: expand the first only
    history = np.zeros((batch * width, 0), dtype=np.int64)
    dist_history = np.zeros((batch * width, 0, vocab))
    finished: list[list[tuple[float, np.ndarray, np.ndarray]]] = [[] for _ in range(batch)]

    def finish(b: int, score: float, tokens: np.ndarray, dists: np.ndarray) -> None:
        normalised = score / length_penalty(len(tokens), strategy.length_penalty)
        finished[b].append((normalised, tokens, dists))

    for t in range(steps):
        require_distribution(log_probs, (scores > -np.inf).reshape(-1), t + 1, shape)
        total = (scores[:, :, None] + log_probs.reshape(batch, width, vocab)).reshape(batch, -1)
        order = np.argsort(-total, axis=1, kind="stable")[:, : 2 * width]
        rows, next_tokens, next_scores = [], [], []
        for b in range(batch):
            keep_rows, keep_tokens, keep_scores = [], [], []
            if len(finished[b]) < width:
                for rank, flat in enumerate(order[b]):
                    beam, token = divmod(int(flat), vocab)
                    score = float(total[b, flat])
                    if score == -np.inf:
                        break
                    row = b * width + beam
                    if token == decoding.eos_id or t + 1 == steps:
                        if rank < width:
                            finish(
                                b,
                                score,
                                np.append(history[row], token),
                                np.concatenate([dist_history[row], log_probs[row][None]]),
                            )
                        if token == decoding.eos_id:
                            continue
                    keep_rows.append(row)
                    keep_tokens.append(token)
                    keep_scores.append(score)
                    if len(keep_rows) == width:
                        break
            # A done source (or one short of live continuations) keeps dead beams to stay square.
            while len(keep_rows) < width:
                keep_rows.append(b * width)
                keep_tokens.append(decoding.pad_id)
                keep_scores.append(-np.inf)
            rows += keep_rows
            next_tokens += keep_tokens
            next_scores += keep_scores
        if all(len(f) >= width for f in finished) or t + 1 == steps:
            break
        rows_arr = np.array(rows)
        chosen = np.array(next_tokens, dtype=np.int64)
        history = np.concatenate([history[rows_arr], chosen[:, None]], axis=1)
        dist_history = np.concatenate([dist_history[rows_arr], log_probs[rows_arr][:, None]], 1)
        scores = np.array(next_scores).reshape(batch, width)
        stepper.reorder(rows_arr)
        log_probs = stepper.step(chosen, np.ones(len(chosen), dtype=bool))

    tokens = np.full((batch, steps), decoding.pad_id, dtype=np.int64)
    dists = np.zeros((batch, steps, vocab))
    lengths = np.zeros(batch, dtype=np.int64)
    for b in range(batch):
        if not finished[b]:  # every continuation was -inf: no hypothesis to answer with
            raise DegenerateOutput(f"beam search: no hypothesis of sequence {b} finished")
        # max() keeps the first of equal scores: the earliest finished, a fixed order.
        _, best_tokens, best_dists = max(finished[b], key=lambda f: f[0])
        lengths[b] = len(best_tokens)
        tokens[b, : len(best_tokens)] = best_tokens
        dists[b, : len(best_tokens)] = best_dists
    return Generation(tokens, lengths, dists)
