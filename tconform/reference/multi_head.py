"""Multi-head attention: Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

One (d_model x d_model) projection per role holds all h heads side by side; splitting its output
into h slices of d_head gives each head's projection (doc 001 explains this equivalence).
Self-attention passes the same sequence as query and key_value; cross-attention passes the
decoder state as query and the encoder output as key_value.
"""

import torch
from torch import nn

from tconform.config import ModelConfig
from tconform.reference.attention import ScaledDotProductAttention


def causal_keep(length: int, device: torch.device) -> torch.Tensor:
    """(length, length) boolean: position t may attend to positions <= t only."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


class MultiHeadAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, causal: bool = False) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.causal = causal
        d = cfg.d_model
        self.w_q = nn.Linear(d, d, bias=cfg.attn_bias)
        self.w_k = nn.Linear(d, d, bias=cfg.attn_bias)
        self.w_v = nn.Linear(d, d, bias=cfg.attn_bias)
        self.w_o = nn.Linear(d, d, bias=cfg.attn_bias)
        self.attention = ScaledDotProductAttention(cfg)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, S, d_model) -> (B, h, S, d_head)."""
        batch, seq, d = x.shape
        return x.reshape(batch, seq, self.n_heads, d // self.n_heads).transpose(1, 2)

    def forward(
        self, query: torch.Tensor, key_value: torch.Tensor, key_keep: torch.Tensor
    ) -> torch.Tensor:
        """key_keep: (B, S_kv) boolean, False at padding positions of key_value."""
        q = self.split_heads(self.w_q(query))
        k = self.split_heads(self.w_k(key_value))
        v = self.split_heads(self.w_v(key_value))
        mask = key_keep[:, None, None, :]  # (B, 1, 1, S_kv): the same for every head and query
        if self.causal:
            mask = mask & causal_keep(query.shape[1], query.device)
        context = self.attention.context(q, k, v, mask)
        batch, _, seq, _ = context.shape
        return self.w_o(context.transpose(1, 2).reshape(batch, seq, -1))


class SelfAttention(nn.Module):
    """Multi-head attention of a sequence over itself (causal: over its own past only)."""

    def __init__(self, cfg: ModelConfig, causal: bool = False) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(cfg, causal)

    def forward(self, x: torch.Tensor, key_keep: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, key_keep)
