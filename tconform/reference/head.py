"""Output head: logits = x W + b over the target vocabulary, probabilities = softmax(logits)."""

import torch
from torch import nn

from tconform.config import ModelConfig


class OutputHead(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(cfg.d_model, cfg.tgt_vocab, bias=cfg.head_bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.proj(x)
        return logits, logits.softmax(dim=-1)
