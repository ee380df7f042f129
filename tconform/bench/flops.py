"""Matrix-multiply FLOP counts and weight bytes of each case, computed from the config alone.

Counted: every matrix product at 2*m*n*k FLOP: the Q, K, V and output projections, Q K^T and
the attention-weighted sum A V (over the full S x S score matrix, since the causal mask is
applied to computed scores, not skipped), both FFN products, and the output head.
Ignored (a few percent at most at base dimensions): bias adds, softmax, masks, norms,
residual adds, ReLU, embedding gathers and the positional encoding.
"""

from __future__ import annotations

from tconform.config import ModelConfig

FLOAT32_BYTES = 4


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


def case_flops(case: str, cfg: ModelConfig, batch: int, src: int, tgt: int) -> int:
    """Matrix-multiply FLOP of one forward pass of `case` (0 for cases without matmuls)."""
    n = cfg.n_layers
    # doc 001's whole model feeds the decoder the source, so its decoder runs at source length.
    model_tgt = src if cfg.decoder_input == "source" else tgt
    counts = {
        "embedding": 0,
        "positional_encoding": 0,
        "norm": 0,
        # The bare attention case takes q (tgt_seq) and k, v (src_seq) already split into heads.
        "attention": 2 * (2 * batch * tgt * src * cfg.d_model),
        "mha_self": attention_flops(cfg, batch, src, src),
        "mha_causal": attention_flops(cfg, batch, tgt, tgt),
        "mha_cross": attention_flops(cfg, batch, tgt, src),
        "feed_forward": feed_forward_flops(cfg, batch, src),
        "encoder_layer": encoder_layer_flops(cfg, batch, src),
        "decoder_layer": decoder_layer_flops(cfg, batch, src, tgt),
        "encoder": n * encoder_layer_flops(cfg, batch, src),
        "decoder": n * decoder_layer_flops(cfg, batch, src, tgt),
        "output_head": head_flops(cfg, batch, tgt),
        "transformer": n * encoder_layer_flops(cfg, batch, src)
        + n * decoder_layer_flops(cfg, batch, src, model_tgt)
        + head_flops(cfg, batch, model_tgt),
    }
    return counts[case]


# --- parameter counts (for the memory-bound floor) --------------------------------------------


def _linear_params(d_in: int, d_out: int, bias: bool) -> int:
    return d_in * d_out + (d_out if bias else 0)


def _attention_params(cfg: ModelConfig) -> int:
    return 4 * _linear_params(cfg.d_model, cfg.d_model, cfg.attn_bias)


def _ffn_params(cfg: ModelConfig) -> int:
    return _linear_params(cfg.d_model, cfg.d_ff, cfg.ffn_bias) + _linear_params(
        cfg.d_ff, cfg.d_model, cfg.ffn_bias
    )


def _norm_params(cfg: ModelConfig) -> int:
    return 2 * cfg.d_model  # gain and bias (alpha and beta in the std variant)


def case_params(case: str, cfg: ModelConfig) -> int:
    """Learned parameters of `case`, as the reference module holds them."""
    n = cfg.n_layers
    final = _norm_params(cfg) if cfg.final_norm else 0
    encoder_layer = _attention_params(cfg) + _ffn_params(cfg) + 2 * _norm_params(cfg)
    decoder_layer = 2 * _attention_params(cfg) + _ffn_params(cfg) + 3 * _norm_params(cfg)
    head = _linear_params(cfg.d_model, cfg.tgt_vocab, cfg.head_bias)
    embeddings = cfg.src_vocab * cfg.d_model
    if cfg.decoder_input == "target":
        embeddings += cfg.tgt_vocab * cfg.d_model
    counts = {
        "embedding": cfg.src_vocab * cfg.d_model,
        "positional_encoding": 0,
        "norm": _norm_params(cfg),
        "attention": 0,
        "mha_self": _attention_params(cfg),
        "mha_causal": _attention_params(cfg),
        "mha_cross": _attention_params(cfg),
        "feed_forward": _ffn_params(cfg),
        "encoder_layer": encoder_layer,
        "decoder_layer": decoder_layer,
        "encoder": n * encoder_layer + final,
        "decoder": n * decoder_layer + final,
        "output_head": head,
        "transformer": embeddings + n * (encoder_layer + decoder_layer) + 2 * final + head,
    }
    return counts[case]


def streamed_weight_bytes(case: str, cfg: ModelConfig, batch: int, seq: int) -> int:
    """Weight bytes a forward pass must read from memory: all parameters, except that an
    embedding table is only gathered from (batch*seq rows of it are read)."""
    params = case_params(case, cfg)
    if case in ("embedding", "transformer"):
        tables = 1 if case == "embedding" or cfg.decoder_input == "source" else 2
        params -= tables * cfg.src_vocab * cfg.d_model
        params += tables * min(batch * seq, cfg.src_vocab) * cfg.d_model
    return params * FLOAT32_BYTES
