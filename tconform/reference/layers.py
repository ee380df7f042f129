"""Encoder and decoder layers: sublayers wrapped in a residual connection and a norm.

post-norm (docs 000, 004): x = Norm(x + Sublayer(x))
pre-norm  (docs 001, 002): x = x + Sublayer(Norm(x))
"""

from collections.abc import Callable

import torch
from torch import nn

from tconform.config import ModelConfig
from tconform.reference.feed_forward import FeedForward
from tconform.reference.multi_head import MultiHeadAttention
from tconform.reference.norm import Norm


def residual(
    x: torch.Tensor, norm: Norm, sublayer: Callable[[torch.Tensor], torch.Tensor], placement: str
) -> torch.Tensor:
    if placement == "pre":
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.placement = cfg.placement
        self.self_attn = MultiHeadAttention(cfg)
        self.ffn = FeedForward(cfg)
        self.norm1 = Norm(cfg)
        self.norm2 = Norm(cfg)

    def forward(self, x: torch.Tensor, src_keep: torch.Tensor) -> torch.Tensor:
        x = residual(x, self.norm1, lambda h: self.self_attn(h, h, src_keep), self.placement)
        return residual(x, self.norm2, self.ffn, self.placement)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.placement = cfg.placement
        self.self_attn = MultiHeadAttention(cfg, causal=True)
        self.cross_attn = MultiHeadAttention(cfg)
        self.ffn = FeedForward(cfg)
        self.norm1 = Norm(cfg)
        self.norm2 = Norm(cfg)
        self.norm3 = Norm(cfg)

    def forward(
        self,
        y: torch.Tensor,
        memory: torch.Tensor,
        src_keep: torch.Tensor,
        tgt_keep: torch.Tensor,
    ) -> torch.Tensor:
        y = residual(y, self.norm1, lambda h: self.self_attn(h, h, tgt_keep), self.placement)
        y = residual(y, self.norm2, lambda h: self.cross_attn(h, memory, src_keep), self.placement)
        return residual(y, self.norm3, self.ffn, self.placement)
