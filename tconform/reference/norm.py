"""Normalisation over the feature axis, in the two forms the documents print.

layernorm: gain * (x - mean) / sqrt(var + eps) + shift, var the biased variance (doc 000)
std:       gain * (x - mean) / (std + eps) + shift, std the unbiased one (docs 001, 002)
"""

import torch
from torch import nn
from torch.nn import functional as F

from tconform.config import ModelConfig


class Norm(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.kind = cfg.norm
        self.eps = cfg.norm_eps
        self.gain = nn.Parameter(torch.empty(cfg.d_model))
        self.shift = nn.Parameter(torch.empty(cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "layernorm":
            # Exactly doc 000's formula; exports as one LayerNormalization node.
            return F.layer_norm(x, self.gain.shape, self.gain, self.shift, self.eps)
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True, unbiased=True)
        return self.gain * (x - mean) / (std + self.eps) + self.shift
