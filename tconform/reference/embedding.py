"""Token embedding: Embedding(i) = E[i], optionally times sqrt(d_model) (doc 004, the paper)."""

import math

import torch
from torch import nn
from torch.nn import functional as F

from tconform.config import ModelConfig


class TokenEmbedding(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.empty(vocab, cfg.d_model))
        self.scale = math.sqrt(cfg.d_model) if cfg.embed_scale else 1.0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.table) * self.scale
