"""The documents' stated properties as checks, each a function returning its worst violation.

Every check takes what an implementation produced (a PE table, attention weights, a function
from inputs to outputs) so that the same check runs on the oracle, on every runtime, and on
deliberately broken variants in the tests. A check holds when its
worst violation is at most the limit for the precision that produced the data.

  pe_shift            PE(pos+k) = R_k PE(pos), R_k a rotation by k·ω_i of each (sin, cos) pair
                      (docs 001 "2.3.2 位置编码", 004 "6、位置编码")
  pe_wavelengths      ω_0 = 1 and ω_i / ω_(i-1) = base^(-2/d): wavelengths 2π·base^(2i/d) form
                      a geometric progression from 2π towards base·2π (doc 004)
  softmax_rows        attention weights in every row sum to 1 (doc 000 "Softmax 和输出层")
  causal              changing target tokens after position t leaves outputs at <= t unchanged
                      (doc 001 "2.2.6 Decoder", masked self-attention)
  multi_head_concat   MultiHead = Concat(head_1..head_h) W^O (docs 000, 004)
  shape_preserved     layers map (B, S, d_model) to (B, S, d_model) (doc 002)
  paper_param_counts  "Attention Is All You Need" Table 3 parameter counts within 5%
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

from tconform import oracle, reference
from tconform.config import PRESETS, ModelConfig
from tconform.doc.data import paper

# Worst violation allowed: float64 evaluation noise, or float32 rounding of O(1) values after a
# few operations (PE angles up to ~12 rad lose ~1e-6 in float32's sin/cos).
# TF32 keeps 10 mantissa bits in matrix products (2^-11 relative per product): a property that
# compares two matrix-product paths (multi-head concatenation) moves by ~1e-3 there.
LIMITS = {"float64": 1e-9, "float32": 2e-5, "tf32": 5e-3}

Run = Callable[[np.ndarray], np.ndarray]  # token ids (B, T) -> outputs (B, T, ...)


def frequencies(d_model: int, base: float) -> np.ndarray:
    """ω_i = base^(-2i/d) for each (sin, cos) column pair i."""
    return base ** (-np.arange(0, d_model, 2) / d_model)


def pe_shift_violation(table: np.ndarray, base: float) -> float:
    """max |PE(pos+k) - R_k PE(pos)| over every pos and k the table holds.

    With s = sin(pos ω), c = cos(pos ω): sin((pos+k)ω) = s cos kω + c sin kω and
    cos((pos+k)ω) = c cos kω - s sin kω; R_k depends on k only, not on pos.
    """
    length, d_model = table.shape
    omega = frequencies(d_model, base)
    sin, cos = table[:, 0::2], table[:, 1::2]
    worst = 0.0
    for k in range(1, length):
        ck, sk = np.cos(k * omega), np.sin(k * omega)
        shifted_sin = sin[:-k] * ck + cos[:-k] * sk
        shifted_cos = cos[:-k] * ck - sin[:-k] * sk
        worst = max(worst, float(np.abs(shifted_sin - sin[k:]).max()))
        worst = max(worst, float(np.abs(shifted_cos - cos[k:]).max()))
    return worst


def pe_wavelength_violation(table: np.ndarray, base: float) -> float:
    """Relative deviation of the measured frequencies from 2π-to-base·2π geometric wavelengths.

    Row pos=1 holds (sin ω_i, cos ω_i) with ω_i in (0, 1], so atan2 recovers ω_i.
    """
    d_model = table.shape[1]
    omega = np.arctan2(table[1, 0::2], table[1, 1::2])
    first = abs(omega[0] - 1.0)  # wavelength 2π/ω_0 = 2π
    ratios = omega[1:] / omega[:-1]
    ratio_error = np.abs(ratios / base ** (-2 / d_model) - 1.0)
    # The cos columns must carry the same frequency as the sin columns (angle identity).
    pair_error = np.abs(table[1, 0::2] ** 2 + table[1, 1::2] ** 2 - 1.0)
    return float(max(first, ratio_error.max(initial=0.0), pair_error.max()))


def softmax_row_violation(weights: np.ndarray) -> float:
    """max |sum_j A[..., i, j] - 1| (rows here are never fully masked)."""
    return float(np.abs(weights.sum(axis=-1) - 1.0).max())


def causal_violation(run: Run, tgt_ids: np.ndarray, vocab: int, seed: int = 0) -> float:
    """Change every token after position t (for each t) and measure how much outputs at
    positions <= t move; a causal model keeps them unchanged."""
    rng = np.random.default_rng(seed)
    before = run(tgt_ids)
    worst = 0.0
    for t in range(tgt_ids.shape[1] - 1):
        changed = tgt_ids.copy()
        # Add 1..vocab-1 modulo vocab, so every later token really differs.
        changed[:, t + 1 :] = (
            changed[:, t + 1 :] + rng.integers(1, vocab, changed[:, t + 1 :].shape)
        ) % vocab
        after = run(changed)
        worst = max(worst, float(np.abs(after[:, : t + 1] - before[:, : t + 1]).max()))
    return worst


def concat_of_heads(
    params: Mapping[str, np.ndarray], cfg: ModelConfig, x: np.ndarray, keep: np.ndarray
) -> np.ndarray:
    """Concat(head_1..head_h) W^O built head by head: head_i uses its own d_head rows of each
    projection (its W_i^Q, W_i^K, W_i^V) and single-head attention."""

    def project(name: str, rows: slice) -> np.ndarray:
        weight = params[f"{name}.weight"][rows]
        bias = params.get(f"{name}.bias")
        return x @ weight.T + (bias[rows] if bias is not None else 0.0)

    heads = []
    for i in range(cfg.n_heads):
        rows = slice(i * cfg.d_head, (i + 1) * cfg.d_head)
        q, k, v = (project(f"attn.{w}", rows) for w in ("w_q", "w_k", "w_v"))
        head, _ = oracle.scaled_dot_product_attention(q, k, v, keep[:, None, :], cfg.fill_value)
        heads.append(head)
    out = np.concatenate(heads, axis=-1) @ params["attn.w_o.weight"].T
    return out + params.get("attn.w_o.bias", 0.0)


def multi_head_violation(
    output: np.ndarray,
    params: Mapping[str, np.ndarray],
    cfg: ModelConfig,
    x: np.ndarray,
    keep: np.ndarray,
) -> float:
    return float(np.abs(output - concat_of_heads(params, cfg, x.astype(np.float64), keep)).max())


def shape_violation(output: np.ndarray, expected: tuple[int, ...]) -> float:
    """0 when the layer kept the shape, 1 when it did not."""
    return 0.0 if tuple(output.shape) == tuple(expected) else 1.0


# --- "Attention Is All You Need", Table 3 (the rows: tconform/doc/data/paper.py) ----------

PAPER_COUNT_TOLERANCE = 0.05


def reference_parameter_count(cfg: ModelConfig, shared_embedding: bool = True) -> int:
    """Parameters of our reference Transformer, built on the meta device (no memory).

    The paper shares one embedding matrix between the source embedding, the target embedding
    and the pre-softmax projection; with shared_embedding we count that matrix once (the
    projection's bias stays, it is not part of the shared matrix).
    """
    with torch.device("meta"):
        model = reference.Transformer(cfg)
    total = sum(p.numel() for p in model.parameters())
    if shared_embedding:
        total -= model.tgt_embed.table.numel() + model.head.proj.weight.numel()
    return int(total)


def paper_counts(shared_embedding: bool = True) -> dict[str, int]:
    """Row -> our reference's parameter count for every Table 3 row (d_ff = ffn_mult·d_model)."""
    base = PRESETS["base"].replace(src_vocab=paper.VOCAB, tgt_vocab=paper.VOCAB)
    return {
        name: reference_parameter_count(base.replace(**changes), shared_embedding)
        for name, changes, _ in paper.TABLE_3
    }


def paper_count_violations(counts: Mapping[str, int]) -> dict[str, float]:
    """Row -> |count / printed - 1|."""
    return {
        name: abs(counts[name] / (float(millions) * 1e6) - 1.0)
        for name, _, millions in paper.TABLE_3
    }


__all__ = [
    "LIMITS",
    "PAPER_COUNT_TOLERANCE",
    "causal_violation",
    "concat_of_heads",
    "multi_head_violation",
    "paper_count_violations",
    "paper_counts",
    "pe_shift_violation",
    "pe_wavelength_violation",
    "reference_parameter_count",
    "shape_violation",
    "softmax_row_violation",
]
