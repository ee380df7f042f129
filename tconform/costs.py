"""Matrix-multiply FLOP counts of the reference architecture, computed from the config alone.

The registry's cases use these formulas (`Case.flops`); tests/test_costs.py checks each against
torch's own FlopCounterMode on the reference modules.

Counted: every matrix product at 2*m*n*k FLOP: the Q, K, V and output projections, Q K^T and
the attention-weighted sum A V (over the full S x S score matrix, since the causal mask is
applied to computed scores, not skipped), both FFN products, and the output head.
Ignored (a few percent at most at base dimensions): bias adds, softmax, masks, norms,
residual adds, ReLU, embedding gathers and the positional encoding.
"""

from __future__ import annotations

from tconform.config import ModelConfig


def linear_flops(rows: int, d_in: int, d_out: int) -> int:
    return 2 * rows * d_in * d_out


def attention_flops(cfg: ModelConfig, batch: int, q_len: int, kv_len: int) -> int:
    """Multi-head attention of q_len queries over kv_len keys, projections included."""
    d = cfg.d_model
    projections = (
        2 * linear_flops(batch * q_len, d, d)  # Q and output projection
        + 2 * linear_flops(batch * kv_len, d, d)  # K and V projections
    )
    # Per head (q_len x d_head) @ (d_head x kv_len) and (q_len x kv_len) @ (kv_len x d_head);
    # summed over heads, d_head * n_heads = d_model.
    scores_and_context = 2 * (2 * batch * q_len * kv_len * d)
    return projections + scores_and_context


def feed_forward_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    rows = batch * seq
    return linear_flops(rows, cfg.d_model, cfg.d_ff) + linear_flops(rows, cfg.d_ff, cfg.d_model)


def encoder_layer_flops(cfg: ModelConfig, batch: int, src: int) -> int:
    return attention_flops(cfg, batch, src, src) + feed_forward_flops(cfg, batch, src)


def decoder_layer_flops(cfg: ModelConfig, batch: int, src: int, tgt: int) -> int:
    return (
        attention_flops(cfg, batch, tgt, tgt)  # causal self-attention
        + attention_flops(cfg, batch, tgt, src)  # cross-attention over the encoder output
        + feed_forward_flops(cfg, batch, tgt)
    )


def head_flops(cfg: ModelConfig, batch: int, tgt: int) -> int:
    return linear_flops(batch * tgt, cfg.d_model, cfg.tgt_vocab)


def transformer_flops(cfg: ModelConfig, batch: int, src: int, tgt: int) -> int:
    # doc 001's whole model feeds the decoder the source, so its decoder runs at source length.
    tgt = src if cfg.decoder_input == "source" else tgt
    n = cfg.n_layers
    return (
        n * encoder_layer_flops(cfg, batch, src)
        + n * decoder_layer_flops(cfg, batch, src, tgt)
        + head_flops(cfg, batch, tgt)
    )
