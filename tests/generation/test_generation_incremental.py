"""The incremental models are the whole model, step by step: reference (float64) against the
whole Transformer, oracle step against oracle prefix, cache against no cache."""

import numpy as np
import pytest
import torch
from gen_helpers import TINY, decode_inputs, params_of, quiet_nan

from tconform import oracle
from tconform.generation.driver import Strategy, generate
from tconform.generation.steppers import CachedStepper, PrefixStepper, oracle_sessions
from tconform.oracle import incremental as oracle_incremental
from tconform.reference import Transformer
from tconform.reference.incremental import DecoderStepModel, EncoderModel
from tconform.weights import load_params

pytestmark = pytest.mark.unit


def _prefix_inputs(batch=2, src=6, steps=5, seed=0):
    rng = np.random.default_rng(seed)
    src_ids = rng.integers(0, TINY.src_vocab, (batch, src))
    src_keep = np.ones((batch, src), dtype=bool)
    src_keep[1, 4:] = False
    tgt_ids = rng.integers(0, TINY.tgt_vocab, (batch, steps))
    return src_ids, src_keep, tgt_ids


def test_reference_steps_equal_the_whole_model_in_float64():
    params = params_of(TINY)
    src_ids, src_keep, tgt_ids = _prefix_inputs()
    whole = load_params(Transformer(TINY).double(), params)
    encoder = load_params(EncoderModel(TINY).double(), params)
    step = load_params(DecoderStepModel(TINY).double(), params)
    tgt_keep = np.ones(tgt_ids.shape, dtype=bool)
    with torch.no_grad():
        logits, _ = whole(*map(torch.from_numpy, (src_ids, src_keep, tgt_ids, tgt_keep)))
        _, cross_k, cross_v = encoder(torch.from_numpy(src_ids), torch.from_numpy(src_keep))
        shape = (TINY.n_layers, len(src_ids), TINY.n_heads, 0, TINY.d_head)
        past_k = past_v = torch.zeros(shape, dtype=torch.float64)
        for t in range(tgt_ids.shape[1]):
            log_probs, past_k, past_v = step(
                torch.from_numpy(tgt_ids[:, t : t + 1]),
                torch.full((len(src_ids),), t),
                torch.from_numpy(src_keep),
                torch.ones(len(src_ids), t, dtype=torch.bool),
                torch.ones(len(src_ids), 1, dtype=torch.bool),
                past_k, past_v, cross_k, cross_v,
            )  # fmt: skip
            expected = logits[:, t : t + 1].log_softmax(-1)
            assert torch.allclose(log_probs, expected, rtol=0, atol=1e-12), t


def test_oracle_step_equals_the_oracle_transformer():
    params = params_of(TINY)
    src_ids, src_keep, tgt_ids = _prefix_inputs(seed=1)
    tgt_keep = np.ones(tgt_ids.shape, dtype=bool)
    logits, _ = oracle.transformer(params, TINY, src_ids, src_keep, tgt_ids, tgt_keep)
    _, cross_k, cross_v = oracle_incremental.encode(params, TINY, src_ids, src_keep)
    shape = (TINY.n_layers, len(src_ids), TINY.n_heads, 0, TINY.d_head)
    past_k = past_v = np.zeros(shape)
    for t in range(tgt_ids.shape[1]):
        log_probs, past_k, past_v = oracle_incremental.decoder_step(
            params, TINY, tgt_ids[:, t : t + 1], np.full(len(src_ids), t), src_keep,
            np.ones((len(src_ids), t), dtype=bool), np.ones((len(src_ids), 1), dtype=bool),
            past_k, past_v, cross_k, cross_v,
        )  # fmt: skip
        np.testing.assert_allclose(
            log_probs, oracle_incremental.log_softmax(logits[:, t : t + 1]), rtol=0, atol=1e-12
        )


@pytest.mark.parametrize("strategy", [Strategy("greedy"), Strategy("beam", beam_width=3)])
def test_oracle_cache_equals_no_cache_on_every_golden(golden_cases, strategy):
    from tconform.generation.golden import set_config

    for case in golden_cases:
        cfg = set_config(TINY, case.source_set)
        sessions = oracle_sessions(cfg, params_of(cfg))
        src_ids, src_keep, prefix = decode_inputs(case)
        with quiet_nan():
            cached = generate(
                CachedStepper(sessions, cfg, np.float64), src_ids, src_keep, case.decoding,
                strategy, prefix,
            )  # fmt: skip
            whole = generate(
                PrefixStepper(sessions, cfg), src_ids, src_keep, case.decoding, strategy, prefix
            )
        np.testing.assert_array_equal(cached.tokens, whole.tokens, err_msg=case.name)
        np.testing.assert_allclose(cached.log_probs, whole.log_probs, rtol=0, atol=1e-12)


def test_fully_masked_rows_are_nan_with_minus_inf_and_finite_with_minus_1e9(golden_cases):
    """The documented edge case: a prompt that starts with padding under the causal mask."""
    by_name = {case.name: case for case in golden_cases}
    nan_rows = by_name["prompt_left_padding_inf-greedy"].input_set.outputs["log_probs"]
    finite_rows = by_name["prompt_left_padding_1e9-greedy"].input_set.outputs["log_probs"]
    starts_padded = by_name["prompt_left_padding_inf-greedy"].input_set.inputs["prefix_keep"][:, 0]
    assert starts_padded.tolist() == [False, False, True]
    assert np.isnan(nan_rows[~starts_padded]).all()
    assert np.isfinite(nan_rows[starts_padded]).all()
    assert np.isfinite(finite_rows).all()


def test_greedy_goldens_are_the_trained_models_answers(golden_cases):
    """The goldens are the checkpoint's: right-padded rows are their source reversed, then the
    end token (cut at the limit in `ends`), and every greedy step outside left padding (which
    the checkpoint never saw) keeps at least the smallest top-1 margin its record measured on
    held-out sources, far above any float32 rounding."""
    from tconform.generation.driver import EOS, PAD
    from tconform.generation.golden import CHECKPOINT
    from tconform.weights import read_record

    record = read_record(CHECKPOINT)
    floor = record["held_out"]["top1_margin"]["min"]
    greedy = {c.source_set.name: c for c in golden_cases if c.strategy.name == "greedy"}
    for name in ("right_padding", "ends"):
        inputs, out = greedy[name].input_set.inputs, greedy[name].input_set.outputs
        limit = out["tokens"].shape[1]
        for row, (ids, keep) in enumerate(zip(inputs["src_ids"], inputs["src_keep"], strict=True)):
            answer = [*ids[keep][::-1].tolist(), EOS][:limit]
            expected = answer + [PAD] * (limit - len(answer))
            assert out["tokens"][row].tolist() == expected, (name, row)
    checked = 0
    for name, case in greedy.items():
        if name == "left_padding":
            continue
        out = case.input_set.outputs
        top2 = np.sort(out["log_probs"].astype(np.float64), axis=-1)[..., -2:]
        margins = top2[..., 1] - top2[..., 0]
        live = np.arange(margins.shape[1]) < out["lengths"][:, None]
        margins = margins[live & np.isfinite(margins)]  # -inf prompt rows are NaN by design
        assert margins.min() >= floor, (name, margins.min(), floor)
        checked += margins.size
    assert checked > 0
