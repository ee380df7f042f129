"""The reference Transformer split for autoregressive decoding (doc 003, section 3.2): the source
is encoded once, then the decoder produces one token per step from what it has produced so far.

Three models, each a `Transformer` with the parts it does not use removed, so every parameter
keeps the whole model's name and therefore its weights (tconform.weights draws by name):

- `EncoderModel`: source ids and mask -> memory, plus every decoder layer's cross-attention keys
  and values, computed once per source instead of once per step.
- `DecoderStepModel`: one new token per sequence with a key/value cache. Inputs: the new ids
  (B, 1), each sequence's position of the new token (B,), the source mask, the keep mask of the
  past (B, P) and of the new token (B, 1), the past self-attention keys and values stacked over
  layers (L, B, H, P, d_head) and the cross-attention ones (L, B, H, S, d_head). Outputs: the
  next-token log-probabilities (B, 1, V) and the self-attention cache grown by one position.
- `PrefixDecoderModel`: the decoder without a cache (the whole prefix every step), the baseline;
  it returns the log-probabilities after the prefix's last position only.

The new token attends to every kept past position and to itself; the causal mask is implicit,
since the cache holds only earlier positions. Its positional encoding is the table's row at its
own position, not row 0: the off-by-one this invites is what tests/generation checks for.
"""

from __future__ import annotations

import torch

from tconform.config import ModelConfig
from tconform.errors import UsageError
from tconform.reference.layers import DecoderLayer, residual
from tconform.reference.multi_head import MultiHeadAttention
from tconform.reference.transformer import Transformer


def _require_target_decoder(cfg: ModelConfig) -> None:
    if cfg.decoder_input != "target":
        raise UsageError(
            "generation needs a decoder that reads the target; this variant's decoder reads the "
            "source (decoder_input=source, doc 001)"
        )


def attend(
    mha: MultiHeadAttention,
    query: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_keep: torch.Tensor,
) -> torch.Tensor:
    """Multi-head attention of `query` over keys and values already split into heads."""
    q = mha.split_heads(mha.w_q(query))
    context, _ = mha.attention(q, k, v, key_keep[:, None, None, :])
    batch, _, seq, _ = context.shape
    return mha.w_o(context.transpose(1, 2).reshape(batch, seq, -1))


def layer_step(
    layer: DecoderLayer,
    y: torch.Tensor,
    src_keep: torch.Tensor,
    keep: torch.Tensor,
    past_k: torch.Tensor,
    past_v: torch.Tensor,
    cross_k: torch.Tensor,
    cross_v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decoder layer for the new position: (output, keys, values with the new position)."""
    grown = {}

    def self_attention(h: torch.Tensor) -> torch.Tensor:
        mha = layer.self_attn
        grown["k"] = torch.cat([past_k, mha.split_heads(mha.w_k(h))], dim=2)
        grown["v"] = torch.cat([past_v, mha.split_heads(mha.w_v(h))], dim=2)
        return attend(mha, h, grown["k"], grown["v"], keep)

    y = residual(y, layer.norm1, self_attention, layer.placement)
    y = residual(
        y,
        layer.norm2,
        lambda h: attend(layer.cross_attn, h, cross_k, cross_v, src_keep),
        layer.placement,
    )
    y = residual(y, layer.norm3, layer.ffn, layer.placement)
    return y, grown["k"], grown["v"]


class EncoderModel(Transformer):
    def __init__(self, cfg: ModelConfig) -> None:
        _require_target_decoder(cfg)
        super().__init__(cfg)
        del self.tgt_embed, self.head
        for layer in self.decoder.layers:  # only the cross-attention key/value projections
            del layer.self_attn, layer.ffn, layer.norm1, layer.norm2, layer.norm3
            del layer.cross_attn.w_q, layer.cross_attn.w_o
        self.decoder.final_norm = None

    def forward(
        self, src_ids: torch.Tensor, src_keep: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        memory = self.encoder(self.positional(self.src_embed(src_ids)), src_keep)
        cross = [layer.cross_attn for layer in self.decoder.layers]
        cross_k = torch.stack([m.split_heads(m.w_k(memory)) for m in cross])
        cross_v = torch.stack([m.split_heads(m.w_v(memory)) for m in cross])
        return memory, cross_k, cross_v


class DecoderStepModel(Transformer):
    def __init__(self, cfg: ModelConfig) -> None:
        _require_target_decoder(cfg)
        super().__init__(cfg)
        del self.src_embed, self.encoder

    def position_encoding(self, position: torch.Tensor) -> torch.Tensor:
        """(B, d_model): each sequence's row of the sinusoid table at its new token's position."""
        return self.positional.table[position].to(self.tgt_embed.table.dtype)

    def forward(
        self,
        tgt_ids: torch.Tensor,
        position: torch.Tensor,
        src_keep: torch.Tensor,
        past_keep: torch.Tensor,
        new_keep: torch.Tensor,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
        cross_k: torch.Tensor,
        cross_v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = self.tgt_embed(tgt_ids) + self.position_encoding(position)[:, None, :]
        keep = torch.cat([past_keep, new_keep], dim=1)
        keys, values = [], []
        for i, layer in enumerate(self.decoder.layers):
            y, k, v = layer_step(
                layer, y, src_keep, keep, past_k[i], past_v[i], cross_k[i], cross_v[i]
            )
            keys.append(k)
            values.append(v)
        if self.decoder.final_norm is not None:
            y = self.decoder.final_norm(y)
        log_probs = self.head.proj(y).log_softmax(dim=-1)
        return log_probs, torch.stack(keys), torch.stack(values)


class PrefixDecoderModel(Transformer):
    def __init__(self, cfg: ModelConfig) -> None:
        _require_target_decoder(cfg)
        super().__init__(cfg)
        del self.src_embed, self.encoder

    def forward(
        self,
        tgt_ids: torch.Tensor,
        tgt_keep: torch.Tensor,
        memory: torch.Tensor,
        src_keep: torch.Tensor,
    ) -> torch.Tensor:
        y = self.positional(self.tgt_embed(tgt_ids))
        last = self.decoder(y, memory, src_keep, tgt_keep)[:, -1:, :]
        return self.head.proj(last).log_softmax(dim=-1)
