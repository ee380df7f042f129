"""Scaled dot-product attention: softmax(Q K^T / sqrt(d_k)) V.

`mask` is boolean and broadcasts to the score matrix; True means "may attend". Masked scores are
set to the configured fill (-inf or -1e9) before the softmax.
"""

import math

import torch
from torch import nn

from tconform.config import ModelConfig


class ScaledDotProductAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fill = cfg.fill_value

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        # A tensor fill rounds to the scores' dtype (-1e9 becomes -inf in float16), as the
        # exported graph does; a Python float fill raises in eager float16.
        scores = scores.masked_fill(~mask, torch.tensor(self.fill, dtype=scores.dtype))
        weights = scores.softmax(dim=-1)
        return weights @ v, weights
