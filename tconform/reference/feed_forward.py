"""Position-wise feed-forward network: FFN(x) = max(0, x W1 + b1) W2 + b2."""

import torch
from torch import nn

from tconform.config import ModelConfig


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.ffn_bias)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.ffn_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.relu(self.w1(x)))
