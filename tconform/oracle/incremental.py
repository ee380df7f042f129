"""The float64 oracle of autoregressive decoding, computed the way tconform.reference.incremental
computes it: encode once (memory and each layer's cross-attention keys/values), then one token
per step against a cache of self-attention keys/values, or the whole prefix each step.

Arrays follow the reference models' layouts: caches (layers, batch, heads, positions, d_head),
log-probabilities (batch, 1, vocabulary). Parameters are the whole Transformer's, by name.
"""

from __future__ import annotations

import numpy as np

from tconform.config import ModelConfig
from tconform.oracle.attention import scaled_dot_product_attention
from tconform.oracle.embedding import token_embedding
from tconform.oracle.feed_forward import feed_forward
from tconform.oracle.layers import residual
from tconform.oracle.norm import norm
from tconform.oracle.params import Params, linear, scope
from tconform.oracle.positional import positional_encoding, sinusoid_table
from tconform.oracle.stacks import decoder, encoder


def log_softmax(z: np.ndarray) -> np.ndarray:
    """z_i - log sum_j exp(z_j), shifted by the row maximum."""
    shifted = z - z.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def split_heads(x: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """(B, S, d_model) -> (B, heads, S, d_head): head i is columns i*d_head..(i+1)*d_head."""
    batch, seq, _ = x.shape
    return x.reshape(batch, seq, cfg.n_heads, cfg.d_head).transpose(0, 2, 1, 3)


def _attend(
    params: Params,
    cfg: ModelConfig,
    query: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    key_keep: np.ndarray,
) -> np.ndarray:
    q = split_heads(linear(scope(params, "w_q"), query), cfg)
    context, _ = scaled_dot_product_attention(q, k, v, key_keep[:, None, None, :], cfg.fill_value)
    batch, _, seq, _ = context.shape
    return linear(scope(params, "w_o"), context.transpose(0, 2, 1, 3).reshape(batch, seq, -1))


def encode(
    params: Params, cfg: ModelConfig, src_ids: np.ndarray, src_keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(memory, cross_k, cross_v): the encoder output and every decoder layer's
    cross-attention keys and values of it."""
    x = positional_encoding({}, cfg, token_embedding(scope(params, "src_embed"), cfg, src_ids))
    memory = encoder(scope(params, "encoder"), cfg, x, src_keep)
    keys, values = [], []
    for i in range(cfg.n_layers):
        cross = scope(params, f"decoder.layers.{i}.cross_attn")
        keys.append(split_heads(linear(scope(cross, "w_k"), memory), cfg))
        values.append(split_heads(linear(scope(cross, "w_v"), memory), cfg))
    return memory, np.stack(keys), np.stack(values)


def decoder_step(
    params: Params,
    cfg: ModelConfig,
    tgt_ids: np.ndarray,
    position: np.ndarray,
    src_keep: np.ndarray,
    past_keep: np.ndarray,
    new_keep: np.ndarray,
    past_k: np.ndarray,
    past_v: np.ndarray,
    cross_k: np.ndarray,
    cross_v: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(log_probs (B, 1, V), keys, values grown by the new position)."""
    table = sinusoid_table(int(position.max()) + 1, cfg.d_model, cfg.pe_base, cfg.pe_formula)
    y = token_embedding(scope(params, "tgt_embed"), cfg, tgt_ids) + table[position][:, None, :]
    keep = np.concatenate([past_keep, new_keep], axis=1)
    keys, values = [], []
    for i in range(cfg.n_layers):
        layer = scope(params, f"decoder.layers.{i}")
        self_attn = scope(layer, "self_attn")
        grown = {}

        def self_attention(h, i=i, self_attn=self_attn, grown=grown):
            grown["k"] = np.concatenate(
                [past_k[i], split_heads(linear(scope(self_attn, "w_k"), h), cfg)], axis=2
            )
            grown["v"] = np.concatenate(
                [past_v[i], split_heads(linear(scope(self_attn, "w_v"), h), cfg)], axis=2
            )
            return _attend(self_attn, cfg, h, grown["k"], grown["v"], keep)

        cross = scope(layer, "cross_attn")
        y = residual(layer, cfg, y, "norm1", self_attention)
        y = residual(
            layer,
            cfg,
            y,
            "norm2",
            lambda h, i=i, cross=cross: _attend(cross, cfg, h, cross_k[i], cross_v[i], src_keep),
        )
        y = residual(
            layer, cfg, y, "norm3", lambda h, layer=layer: feed_forward(scope(layer, "ffn"), cfg, h)
        )
        keys.append(grown["k"])
        values.append(grown["v"])
    if cfg.final_norm:
        y = norm(scope(params, "decoder.final_norm"), cfg, y)
    log_probs = log_softmax(linear(scope(params, "head.proj"), y))
    return log_probs, np.stack(keys), np.stack(values)


def prefix_decoder(
    params: Params,
    cfg: ModelConfig,
    tgt_ids: np.ndarray,
    tgt_keep: np.ndarray,
    memory: np.ndarray,
    src_keep: np.ndarray,
) -> np.ndarray:
    """log_probs (B, 1, V) after the last position, decoding the whole prefix (no cache)."""
    y = positional_encoding({}, cfg, token_embedding(scope(params, "tgt_embed"), cfg, tgt_ids))
    last = decoder(scope(params, "decoder"), cfg, y, memory, src_keep, tgt_keep)[:, -1:, :]
    return log_softmax(linear(scope(params, "head.proj"), last))
